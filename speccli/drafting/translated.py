"""A draft model of another vocabulary: its drafted text, re-tokenized by the target, is the proposal
(SLEM; or, sampling where the vocabularies share enough tokens, token-level intersection, TLI:
docs/drafting.md, *A draft of another vocabulary*). Text proposals carry no q and are verified as a
lookup's are; a TLI token's q is the draft's distribution restricted to the shared tokens.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import numpy as np

from speccli.core.sampling import Distribution, RowBuffer, SamplingParams, distribution, greedy_token, sample
from speccli.core.seam import DraftCosts
from speccli.drafting.model import Intake, timed_costs
from speccli.vocab.shared import SharedTokens, SharedVocabulary, on_shared_tokens
from speccli.vocab.translate import translate

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model
    from speccli.llama.tokenizer import Tokenizer


class TranslatedDrafter:
    """Drafts with a `Model` of another vocabulary a block at a time, re-tokenized as a whole: the
    planner neither stops it early nor hands it over."""

    name = "model"
    drafts_by_token = False

    def __init__(self, model: Model, target_vocabulary: Tokenizer, shared: SharedVocabulary | None = None) -> None:
        self.model = model
        self.target = target_vocabulary
        # Given: token-level intersection (below); None: the drafted text, re-tokenized.
        self.shared = None if shared is None else SharedTokens(shared, target_vocabulary.n_vocab)
        self._held: list[int] = []  # the draft ids its cache holds
        self._covered = 0  # target tokens of context its cache holds, as of its last proposal
        self._q_row = RowBuffer()

    def catch_up_tokens(self, context: Sequence[int]) -> int:
        """As `ModelDrafter.catch_up_tokens`, in target tokens (the draft's are known once re-tokenized)."""
        pending = len(context) - self._covered
        return pending - 1 if pending > 2 else 0

    def room(self, context: Sequence[int], limit: int) -> int:
        return limit

    def owed_prompt_tokens(self) -> int:
        return 0  # `sync` reads the prompt in the prefill

    def draft_block(
        self, context: Sequence[int], k: int, limit: int, sampling: SamplingParams, rng: np.random.Generator,
    ) -> tuple[list[int], list[Distribution] | None, Intake]:
        """Up to k draft tokens, as target ids (at most `limit`), the q they were drawn from where they
        were drawn among the shared tokens (else None: proposed with certainty), and what was taken in."""
        model = self.model
        read = self._read(context, catching_up=self.catch_up_tokens(context) > 0)
        if read is None:  # the context, as the draft's tokens, fills its window
            return [], None, Intake()
        logits, catch_up, catch_up_seconds = read
        intake = Intake(catch_up_seconds=catch_up_seconds, catch_up_tokens=catch_up)
        # TLI when sampling: each token drawn from the draft's distribution restricted to the tokens both
        # vocabularies spell alike, on the target's ids (its q). Greedy, text is kept more (docs/drafting.md).
        shared = self.shared if not sampling.greedy else None
        # Each drafted token but the last is decoded: k - 1 decodes must fit the draft's window.
        k = min(k, model.n_ctx - model.n_past + 1, limit if shared else k)
        drafted: list[int] = []
        proposal: list[int] = []  # TLI's, as target ids
        drawn_from: list[Distribution] = []
        for i in range(k):
            if sampling.greedy:
                token = greedy_token(logits[0])
            else:
                q = distribution(logits[0], sampling, out=self._q_row.take(1, model.n_vocab)[0])
                if shared is None:
                    token = sample(q, rng)
                elif (restricted := on_shared_tokens(q, shared)) is None:  # no mass on the shared tokens
                    break
                else:
                    proposal.append(sample(restricted, rng))
                    drawn_from.append(restricted)
                    token = shared.draft_of_target[proposal[-1]]
            if shared is None and model.tokenizer.is_end_of_generation(token):
                break
            drafted.append(token)
            if i + 1 < k:
                logits = model.decode([token], n_logit_rows=1)
                self._held.append(token)
        if shared is None:
            proposal = translate(self.target, context, model.tokenizer.detokenize(drafted))[:limit]
        self._covered = len(context) + len(proposal)
        return proposal, drawn_from or None, intake

    def _read(self, context: Sequence[int], catching_up: bool = False) -> tuple[np.ndarray, int, float] | None:
        """The draft's logits after the context, read as text (the new text may re-tokenize what the cache
        held), with the catch-up's tokens and seconds: where it skipped steps (`catching_up`), all but the
        last token taken in, timed apart; None where the context does not fit its window."""
        text = self.target.detokenize(context, special=True)
        ids = self.model.tokenizer.tokenize(text, add_special=True, parse_special=True)
        if len(ids) >= self.model.n_ctx:
            return None
        kept = 0
        for held, new in zip(self._held, ids):
            if held != new:
                break
            kept += 1
        kept = min(kept, self.model.n_past, len(ids) - 1)  # the last token is decoded: its row is the first draft's
        self.model.truncate(kept)
        pending = ids[kept:]
        catch_up = len(pending) - 1 if catching_up and len(pending) > 1 else 0
        catch_up_seconds = 0.0
        if catch_up:
            began = time.perf_counter()
            self.model.decode(pending[:-1], n_logit_rows=0)
            catch_up_seconds = time.perf_counter() - began
            pending = pending[-1:]
        logits = self.model.decode(pending, n_logit_rows=1)
        self._held = list(ids)
        return logits, catch_up, catch_up_seconds

    def sync(self, context: Sequence[int]) -> None:
        """Read the prompt before the first step, as a same-vocabulary draft takes it in: not a catch-up."""
        if len(context) > 1 and self._read(context[:-1]) is not None:
            self._covered = len(context) - 1

    def forget(self, n_tokens: int) -> None:
        # The next proposal reads the context again, keeping what still matches in the draft's cache.
        self._covered = min(self._covered, n_tokens)

    def new_conversation(self) -> None:
        self.model.reset()
        self._held = []
        self._covered = 0
        self._q_row = RowBuffer()  # a row of the draft's vocabulary: not kept idle

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        return {self.name: timed_costs(self.model, [0])}
