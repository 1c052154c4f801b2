"""A smaller model of the same vocabulary as the draft source: its next token and the q it was drawn from.

Passive: the planner (speccli/drafting/planner.py) asks what taking in the context would cost
(`catch_up_tokens`, `owed_prompt_tokens`), has it take it in (`begin`), then asks for one token at a
time (`next`) for as long as it decides, and tells it which it keeps (`take`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from speccli.core.constraint import Constraint
from speccli.core.sampling import Distribution, RowBuffer, SamplingParams, distribution_among, greedy_token, sample
from speccli.core.seam import DraftCosts

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model


CATCH_UP_SIZES = (2, 16)  # timed at calibration: a catch-up is priced on the line through them


@dataclass(frozen=True)
class Intake:
    """What a draft model took in before drafting: its deferred prompt, and context it had skipped."""

    prompt_seconds: float = 0.0
    prompt_tokens: int = 0
    catch_up_seconds: float = 0.0
    catch_up_tokens: int = 0


class ModelDrafter:
    """Drafts with a draft `Model`, keeping its KV cache a prefix of the context between steps."""

    name = "model"
    drafts_by_token = True  # the planner may stop it after any token, or hand the draft to a lookup

    def __init__(self, model: Model) -> None:
        self.model = model
        self._q_rows = RowBuffer()
        self._prompt_end = 0  # the cache must hold the context this far before drafting (see `sync`)
        self._pending: list[int] = []  # what the next decode takes in before giving a row
        self._rows: np.ndarray = np.empty((0, 0), dtype=np.float32)
        self._drawn = 0

    def sync(self, context: Sequence[int]) -> None:
        """Owe context[:-1], taken in at this model's first draft of the reply: a reply other sources draft
        throughout never pays for it (docs/results.md: Qwen's agent workload). Only the part more than one
        batch from the end is taken in now, in the prefill, where a stop request is seen between batches."""
        self._prompt_end = len(context) - 1
        taken_in_now = self._prompt_end - self.model.n_batch
        if self.model.n_past < taken_in_now:
            self.model.decode(self.visible(context[self.model.n_past : taken_in_now]), n_logit_rows=0)

    def room(self, context: Sequence[int], limit: int) -> int:
        """How many of `limit` tokens it can draft: decoding k - 1 past the context must fit its window."""
        return min(limit, self.model.n_ctx - len(context) + 1)

    def catch_up_tokens(self, context: Sequence[int]) -> int:
        """Tokens taken in as one decode before drafting at the end of `context`, where it grew without
        this model by more than the two a drafting step leaves behind (the pending token, and the bonus
        token if the draft never decoded it); all but the last, decoded with the first draft token. The
        prompt it owes is counted apart (`owed_prompt_tokens`)."""
        pending = len(context) - max(self.model.n_past, self._prompt_end)
        return pending - 1 if pending > 2 else 0

    def owed_prompt_tokens(self) -> int:
        """Tokens of the reply's prompt `sync` deferred that the cache does not hold yet."""
        return max(0, self._prompt_end - self.model.n_past)

    def begin(self, context: Sequence[int], k: int) -> Intake:
        """Take in what drafting at the end of `context` needs (the deferred prompt, a catch-up: each timed
        apart, so the policy's per-token cost stays what drafting costs), for up to k tokens."""
        model = self.model
        prompt_seconds, prompt_tokens = 0.0, self.owed_prompt_tokens()
        if prompt_tokens:
            began = time.perf_counter()
            model.decode(self.visible(context[model.n_past : self._prompt_end]), n_logit_rows=0)
            prompt_seconds = time.perf_counter() - began
        catch_up = self.catch_up_tokens(context)
        self._pending = self.visible(context[model.n_past :])
        catch_up_seconds = 0.0
        if catch_up:
            began = time.perf_counter()
            model.decode(self._pending[:-1], n_logit_rows=0)
            catch_up_seconds = time.perf_counter() - began
            self._pending = self._pending[-1:]
        self._rows = self._q_rows.take(k, model.n_vocab)  # dense rows' weights (no filter bounds them)
        self._drawn = 0
        return Intake(prompt_seconds, prompt_tokens, catch_up_seconds, catch_up)

    def next(self, sampling: SamplingParams, rng: np.random.Generator,
             constraint: Constraint | None = None) -> tuple[int, Distribution | None]:
        """Decode what is pending and draw the next token (the argmax when greedy: q None), through the
        grammar's mask where the reply has one."""
        logits = self.model.decode(self._pending, n_logit_rows=1)[0]
        self._pending = []
        ids, values = (None, logits) if constraint is None else constraint.read(logits)
        if sampling.greedy:
            return greedy_token(values, ids), None  # a NaN row is refused by name
        row = self._rows[self._drawn][: len(values)]
        self._drawn += 1
        q = distribution_among(ids, values, sampling, len(logits), out=row)
        return sample(q, rng), q

    def take(self, *tokens: int) -> None:
        """The planner keeps `tokens` (drafted, or forced by a grammar): the next decode takes them in. A
        draft's last tokens are never decoded here; if all pass, the next step catches up."""
        self._pending += self.visible(tokens)

    def visible(self, tokens: Sequence[int]) -> list[int]:
        """Tokens as the draft can take them: a target's ids past a smaller draft's vocabulary (padding
        check-vocab tolerates) read as token 0. That changes what it proposes, never the output's law:
        verification uses the q it sampled."""
        return [token if token < self.model.n_vocab else 0 for token in tokens]

    def forget(self, n_tokens: int) -> None:
        self.model.truncate(min(self.model.n_past, n_tokens))
        self._prompt_end = min(self._prompt_end, n_tokens)

    def new_conversation(self) -> None:
        self.model.reset()
        self._prompt_end = 0
        self._q_rows = RowBuffer()  # K rows of the vocabulary (64 MiB at K=64, 262k tokens): not kept idle
        self._rows = np.empty((0, 0), dtype=np.float32)

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        # any token costs the same: the cache may hold more than `context`
        return {self.name: timed_costs(self.model, self.visible([context[-1]]))}


def timed_costs(model: Model, token: list[int]) -> DraftCosts:
    """One draft decode of `token` (the second of two: a first decode's set-up is not counted), and
    catch-up decodes of CATCH_UP_SIZES tokens that fit, each timed at the cache's end and dropped."""
    seconds = [model.time_decode(token, n_logit_rows=1) for _ in range(2)]
    catch_up = {n: model.time_decode(token * n, n_logit_rows=0) for n in CATCH_UP_SIZES if model.n_past + n <= model.n_ctx}
    return DraftCosts(seconds[-1], catch_up)
