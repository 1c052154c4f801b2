"""The generation loop: prompt -> tokens -> draft -> verify -> accept/resample -> text, with stats.

`Generator.generate` yields the same events with a draft model (speculative) or without one (the
target alone), so chat and bench only consume them. It keeps the models' KV caches between calls
and decodes only what changed: a new chat turn costs its new tokens, not the whole history.

Invariant between steps: each model's KV cache holds a prefix of `self.tokens`, and never the
last token (the "pending" one, whose logits the next step needs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from speccli.core.stats import DoneEvent, Event, RunStats, Source, StepEvent, TokenEvent
from speccli.core.text import TextAssembler
from speccli.llama.model import Model
from speccli.errors import SpeccliError
from speccli.core.sampling import SamplingParams, probabilities, sample
from speccli.core.verify import Verdict, verify_greedy, verify_sampled

MAX_K = 64


@dataclass(frozen=True)
class GenerationLimits:
    max_tokens: int = 256
    stop: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise SpeccliError(f"max tokens must be >= 1, got {self.max_tokens}")


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def validate_k(k: int) -> None:
    if not 1 <= k <= MAX_K:
        raise SpeccliError(f"k (draft tokens per step) must be between 1 and {MAX_K}, got {k}")


class Generator:
    """Speculative generation with a draft model, or the target alone (`draft=None`, the baseline).

    Both go through the same backend, sampler and bookkeeping, so a comparison between them is fair.
    """

    def __init__(
        self, target: Model, draft: Model | None, sampling: SamplingParams, k: int, seed: int | None = None
    ) -> None:
        sampling.validate()
        if draft is not None:
            validate_k(k)
        self.target = target
        self.draft = draft
        self.sampling = sampling
        self.k = k if draft is not None else 0
        self.rng = np.random.default_rng(seed)
        self.tokens: list[int] = []  # everything the models have been shown or have generated
        # Probability rows are rewritten every step: reusing the memory keeps the time outside
        # llama_decode small (fresh arrays of a 262k vocabulary cost page faults each time).
        self._draft_rows = _RowBuffer()
        self._target_rows = _RowBuffer()

    def _models(self) -> list[Model]:
        return [self.target] if self.draft is None else [self.target, self.draft]

    def reset(self) -> None:
        for model in self._models():
            model.reset()
        self.tokens = []

    def generate(self, prompt: Sequence[int], limits: GenerationLimits = GenerationLimits()) -> Iterator[Event]:
        limits.validate()
        stats = RunStats(prompt_tokens=len(prompt))
        stats.prefill_seconds = self._prefill(prompt)
        text = TextAssembler(limits.stop)
        tokenizer = self.target.tokenizer
        reason = None
        while reason is None:
            room = min(model.n_ctx for model in self._models()) - len(self.tokens)
            if room < 0:
                reason = "context"
                break
            # No drafts the context cannot hold, nor more than the reply still needs.
            new_tokens, sources, step = self._step(min(self.k, room, limits.max_tokens - stats.generated - 1))
            stats.add(step)
            yield step
            used = 0
            for token, source in zip(new_tokens, sources):
                used += 1
                if tokenizer.is_end_of_generation(token):
                    reason = "eog"
                    break
                stats.generated += 1
                yield TokenEvent(token, text.push(tokenizer.token_bytes(token)), source)
                if text.stopped:
                    reason = "stop"
                    break
                if stats.generated >= limits.max_tokens:
                    reason = "max_tokens"
                    break
            self._forget_unused(len(new_tokens) - used)
        yield DoneEvent(reason, stats, text.flush())

    def _forget_unused(self, count: int) -> None:
        """Drop accepted tokens past the stopping point, so `tokens` is what the user was shown
        (plus the end-of-generation token, if that ended it) and a next turn continues from there."""
        if count:
            del self.tokens[-count:]
            for model in self._models():
                model.truncate(min(model.n_past, len(self.tokens) - 1))

    def _prefill(self, prompt: Sequence[int]) -> float:
        """Make every cache hold prompt[:-1], keeping the longest prefix it already holds."""
        if not prompt:
            raise SpeccliError("the prompt is empty")
        n_ctx = min(model.n_ctx for model in self._models())
        if len(prompt) > n_ctx:
            raise SpeccliError(f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}; raise --ctx")
        shared = common_prefix_length(self.tokens, prompt[:-1])
        started = time.perf_counter()
        # Until every cache holds the new prompt, only the shared prefix is known to be in them all:
        # if a decode fails half-way, the next call must not trust what this one left behind.
        self.tokens = list(prompt[:shared])
        for model in self._models():
            model.truncate(min(model.n_past, shared))
            if model.n_past < len(prompt) - 1:
                model.decode(self._visible_to(model, prompt[model.n_past : -1]), n_logit_rows=0)
        self.tokens = list(prompt)
        return time.perf_counter() - started

    @staticmethod
    def _visible_to(model: Model, tokens: Sequence[int]) -> list[int]:
        """Tokens as a model can take them: a target may have ids past a smaller draft's vocabulary
        (padding that check-vocab tolerates). The draft sees token 0 there instead. That changes only
        what the draft proposes, never the output distribution: verification uses the q it sampled."""
        return [token if token < model.n_vocab else 0 for token in tokens]

    def _step(self, k: int) -> tuple[list[int], list[Source], StepEvent]:
        """Draft k tokens, verify them in one target decode, keep the accepted prefix and one more."""
        started = time.perf_counter()
        drafted, q_rows, draft_seconds = self._draft(k) if k else ([], None, 0.0)
        target_started = time.perf_counter()
        target_logits = self.target.decode(self.tokens[self.target.n_past :] + drafted, n_logit_rows=k + 1)
        target_seconds = time.perf_counter() - target_started
        verdict = self._verify(np.array(drafted, dtype=np.int64), q_rows, target_logits)
        new_tokens = drafted[: verdict.n_accepted] + [verdict.next_token]
        self.tokens += new_tokens
        # Forget the rejected drafts; the new last token stays pending for the next step.
        self.target.truncate(len(self.tokens) - 1)
        if self.draft is not None:
            self.draft.truncate(min(self.draft.n_past, len(self.tokens) - 1))
        sources = [Source.DRAFT] * verdict.n_accepted + [_source_of_next(verdict, k, self.draft is not None)]
        other_seconds = time.perf_counter() - started - draft_seconds - target_seconds
        source = "model" if k else None
        return new_tokens, sources, StepEvent(k, verdict.n_accepted, draft_seconds, target_seconds, other_seconds, source)

    def _draft(self, k: int) -> tuple[list[int], np.ndarray, float]:
        """k tokens from the draft, each drawn from q, with q kept (sampling only) for verification."""
        draft, decode_seconds = self.draft, 0.0
        drafted: list[int] = []
        q_rows = self._draft_rows.take(k, draft.n_vocab)
        # The last token, and the previous bonus if the draft missed it.
        pending = self._visible_to(draft, self.tokens[draft.n_past :])
        for i in range(k):
            decode_started = time.perf_counter()
            logits = draft.decode(pending, n_logit_rows=1)
            decode_seconds += time.perf_counter() - decode_started
            if self.sampling.greedy:
                token = int(logits[0].argmax())
            else:
                token = sample(probabilities(logits, self.sampling, out=q_rows[i : i + 1])[0], self.rng)
            drafted.append(token)
            pending = [token]
        # The last draft token is not decoded by the draft: if all k pass, the next step catches up.
        return drafted, q_rows, decode_seconds

    def _verify(self, drafted: np.ndarray, q: np.ndarray, target_logits: np.ndarray) -> Verdict:
        if self.sampling.greedy:
            return verify_greedy(drafted, target_logits)
        p = probabilities(target_logits, self.sampling, out=self._target_rows.take(*target_logits.shape))
        if not len(drafted):
            return Verdict(0, sample(p[0], self.rng))
        if q.shape[1] != p.shape[1]:  # vocabularies of different sizes (a padded one): compare on the union
            width = max(q.shape[1], p.shape[1])
            q, p = (np.pad(rows, ((0, 0), (0, width - rows.shape[1]))) for rows in (q, p))
        return verify_sampled(drafted, q, p, self.rng)


class _RowBuffer:
    """A float32 (rows, vocab) array kept between steps, grown when a step needs more rows."""

    def __init__(self) -> None:
        self._array = np.empty((0, 0), dtype=np.float32)

    def take(self, rows: int, vocab: int) -> np.ndarray:
        if self._array.shape[0] < rows or self._array.shape[1] != vocab:
            self._array = np.empty((rows, vocab), dtype=np.float32)
        return self._array[:rows]


def _source_of_next(verdict: Verdict, k: int, speculative: bool) -> Source:
    if not speculative or k == 0:  # no drafts this step (end of the reply or of the context)
        return Source.TARGET
    return Source.BONUS if verdict.is_bonus(k) else Source.CORRECTION
