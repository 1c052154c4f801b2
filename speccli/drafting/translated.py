"""A draft model of another vocabulary: its drafted text, re-tokenized by the target, is the proposal
(string-level drafting, SLEM; or, sampling where the vocabularies share enough tokens, token-level
intersection, TLI). docs/drafting.md, *A draft of another vocabulary*, says how each works and when.

Text proposals carry no q: they are verified as a lookup's are (x kept with probability p(x), else a
draw from p without x), exact for any proposal made from the past and the draft's own randomness. A
TLI token's q is the draft's distribution restricted to the shared tokens, verified by the usual rule.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import numpy as np

from speccli.core.sampling import Distribution, RowBuffer, SamplingParams, distribution, greedy_token, sample
from speccli.core.seam import DraftCosts
from speccli.drafting.model import Intake, timed_costs
from speccli.vocab.shared import SharedTokens, SharedVocabulary, on_shared_tokens

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model
    from speccli.llama.tokenizer import Tokenizer

WINDOW = 4  # target tokens of context re-tokenized with the drafted text, to find where the proposal starts


class TranslatedDrafter:
    """Drafts with a draft `Model` whose vocabulary is not the target's (`target_vocabulary`): a block of
    tokens at a time, re-tokenized as a whole, so the planner neither stops it early nor hands it over."""

    name = "model"
    drafts_by_token = False

    def __init__(self, model: Model, target_vocabulary: Tokenizer, shared: SharedVocabulary | None = None) -> None:
        self.model = model
        self.target = target_vocabulary
        # Given: token-level intersection (below); None: the drafted text, re-tokenized.
        self.shared = None if shared is None else SharedTokens(shared, target_vocabulary.n_vocab)
        self.mode = "text" if shared is None else "shared tokens"
        self._held: list[int] = []  # the draft ids its cache holds
        self._covered = 0  # target tokens of context its cache holds, as of its last proposal
        self._q_row = RowBuffer()

    def catch_up_tokens(self, context: Sequence[int]) -> int:
        """As a same-vocabulary draft model's (`ModelDrafter.catch_up_tokens`), counted in target tokens:
        the draft's own count is known only once the context is re-tokenized."""
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
        # Each drafted token but the last is decoded: k - 1 decodes must fit the draft's window.
        k = min(k, model.n_ctx - model.n_past + 1)
        if self.shared is not None and not sampling.greedy:  # greedy, text is kept more (docs/drafting.md)
            proposal, q = self._draft_shared_tokens(logits, min(k, limit), sampling, rng)
            self._covered = len(context) + len(proposal)
            return proposal, q, intake
        drafted: list[int] = []
        for i in range(k):
            if sampling.greedy:
                token = greedy_token(logits[0])
            else:
                token = sample(distribution(logits[0], sampling, out=self._q_row.take(1, model.n_vocab)[0]), rng)
            if model.tokenizer.is_end_of_generation(token):
                break
            drafted.append(token)
            if i + 1 < k:
                logits = model.decode([token], n_logit_rows=1)
                self._held.append(token)
        proposal = self._translate(context, model.tokenizer.detokenize(drafted))[:limit]
        self._covered = len(context) + len(proposal)
        return proposal, None, intake

    def _draft_shared_tokens(self, logits: np.ndarray, k: int, sampling: SamplingParams, rng: np.random.Generator) -> tuple[list[int], list[Distribution] | None]:
        """Token-level intersection (TLI), when sampling: each token drawn from the draft's distribution
        restricted to the tokens both vocabularies spell alike, renormalised, on the target's ids; the
        distribution it was drawn from is its q."""
        model, shared = self.model, self.shared
        proposal: list[int] = []
        drawn_from: list[Distribution] = []
        for i in range(k):
            restricted = on_shared_tokens(distribution(logits[0], sampling, out=self._q_row.take(1, model.n_vocab)[0]),
                                          shared)
            if restricted is None:  # the draft gives the shared tokens nothing: no proposal to make
                break
            chosen = sample(restricted, rng)
            proposal.append(chosen)
            drawn_from.append(restricted)
            if i + 1 < k:
                token = shared.draft_of_target[chosen]
                logits = model.decode([token], n_logit_rows=1)
                self._held.append(token)
        return proposal, drawn_from or None

    def _read(self, context: Sequence[int], catching_up: bool = False) -> tuple[np.ndarray, int, float] | None:
        """The draft's logits after the context, read as text; None where they do not fit its window.
        Re-tokenizing the context and taking in what changed is part of every step's drafting (the new
        text may re-tokenize what the cache held); where the draft skipped steps (`catching_up`), all
        but the last token it takes in are a catch-up, decoded and timed apart as a same-vocabulary
        draft's are: how many draft tokens, and its seconds, come back with the logits."""
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

    def _translate(self, context: Sequence[int], drafted_text: bytes) -> list[int]:
        """Target ids of `drafted_text` as it follows the context; [] where they cannot be told apart."""
        drafted_text = whole_words(drafted_text)
        if not drafted_text:
            return []
        for size in (WINDOW, 1):
            window = list(context[-size:])
            ids = self.target.tokenize(self.target.detokenize(window, special=True) + drafted_text,
                                       add_special=False, parse_special=True)
            if ids[:len(window)] == window:
                return ids[len(window):]
        return []

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


def whole_words(text: bytes) -> bytes:
    """`text` without the word it may end in the middle of (the text after it could have made that word
    other tokens), and the space before that word (tokenizers join a space to the word after it)."""
    end = len(text)
    while end and _in_word(text[end - 1]):
        end -= 1
    if end == len(text):
        return text
    return text[:end - 1] if text[end - 1:end] == b" " else text[:end]


def _in_word(byte: int) -> bool:
    return byte >= 0x80 or chr(byte).isalnum() or byte == ord("_")  # UTF-8 beyond ASCII counts as letters
