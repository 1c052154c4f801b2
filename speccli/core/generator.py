"""The generation loop: prompt -> tokens -> draft -> verify -> accept/resample -> text, with stats.

`Generator.generate` yields the same events with a drafter (speculative: a draft model, n-gram
lookup, or both) or without one (the target alone), so chat, bench and the server only consume them.
It keeps the models' KV caches between calls and decodes only what changed: a new chat turn costs
its new tokens, not the whole history.

Invariant between steps: each model's KV cache holds a prefix of `self.tokens`, and never the
last token (the "pending" one, whose logits the next step needs).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from speccli.core.constraint import Constraint, ConstrainedRows, Grammar
from speccli.core.sampling import Distribution, RowBuffer, RowDistributions, SamplingParams, distribution, sample
from speccli.core.seam import CostProfile, Draft, Drafting, KPolicy
from speccli.core.stats import DoneEvent, Event, RunStats, Source, StepEvent, TokenEvent
from speccli.core.text import TextAssembler
from speccli.core.verify import DraftVerdict, verify_greedy, verify_sampled
from speccli.errors import SpeccliError
from speccli.llama.clock import COMPUTE_CLOCK
from speccli.util.sequences import common_prefix_length
from speccli.validation import check_max_tokens

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model


PROFILE_TIMINGS = 3  # timings of each cost in a profile, of which the least is kept


@dataclass(frozen=True)
class GenerationLimits:
    """What bounds a reply: its length, strings that end it, and a grammar its text must follow."""

    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    grammar: Grammar | None = None

    def validate(self) -> None:
        check_max_tokens(self.max_tokens, "max tokens")


class Generator:
    """Speculative generation with a drafter, or the target alone (`drafter=None`, the baseline).

    Both go through the same backend, sampler and bookkeeping, so a comparison between them is fair.
    `policy` (required with a drafter) chooses each step's draft length, priced by `costs`.
    """

    def __init__(
        self,
        target: Model,
        drafter: Drafting | None,
        sampling: SamplingParams,
        policy: KPolicy | None = None,
        seed: int | None = None,
        costs: PairCosts | None = None,
    ) -> None:
        sampling.validate()
        self.target = target
        self.drafter = drafter
        self.sampling = sampling
        if drafter is not None and policy is None:
            raise ValueError("a drafter needs a K policy")
        self.policy = policy
        # The pair's cost profile, shared with the caller's other generators where it gives one.
        self.costs = PairCosts(target, drafter) if costs is None else costs
        self.rng = np.random.default_rng(seed)
        self.tokens: list[int] = []  # everything the models have been shown or have generated
        self.reply_stats = RunStats()  # the reply under way, or the last one: what `generate` has counted
        self._target_row = RowBuffer()
        self._constraint: Constraint | None = None  # the reply's grammar state, where it has one

    def reused_prefix(self, prompt: Sequence[int]) -> int:
        """Tokens of `prompt` the caches hold already (a chat's earlier turns): the prefill skips them.
        The prompt's last token is always decoded, to give the first logits; nor does any cache hold
        the last token of `tokens` yet (a reply's last), though the prompt may repeat it."""
        return min(common_prefix_length(self.tokens, prompt[:-1]), self.target.n_past)

    def reset(self) -> None:
        """Another conversation: empty the caches. What a drafter keeps across conversations stays."""
        self.target.reset()
        if self.drafter is not None:
            self.drafter.new_conversation()
        self.tokens = []

    def generate(
        self, prompt: Sequence[int], limits: GenerationLimits = GenerationLimits(),
        stop_requested: Callable[[], bool] = lambda: False,
    ) -> Iterator[Event]:
        """The reply's events, ending with DoneEvent. Where `stop_requested()` turns true (Ctrl-C, a
        client gone, a server shutting down), it ends with no more events and no DoneEvent: between two
        batches of the prefill (a long prompt takes seconds to decode, which the caller's own check
        between events would wait out), or between two steps, so that the tokens of a step verified
        are all given, and the figures count no more than them."""
        limits.validate()
        if self.drafter is not None:
            self.policy.begin_reply()
        # Shared with the caller, who may stop reading before DoneEvent (Ctrl-C, a client gone) and still
        # report what the reply cost, its prefill included.
        self.reply_stats = stats = RunStats(prompt_tokens=len(prompt))
        self._constraint = limits.grammar.start() if limits.grammar is not None else None
        started = time.perf_counter()
        prefilled = self._prefill(prompt, stop_requested)
        stats.prefill_seconds = time.perf_counter() - started
        if not prefilled:
            return
        text = TextAssembler(limits.stop)
        tokenizer = self.target.tokenizer
        reason = None
        while reason is None:
            if stop_requested():
                return
            room = self.target.n_ctx - len(self.tokens)
            if room < 0:
                reason = "context"
                break
            # No drafts the context cannot hold, nor more than the reply still needs, nor more verified
            # rows than one decode returns (llama.cpp clamps its batch to a small --ctx).
            limit = min(room, limits.max_tokens - stats.generated - 1, self.target.n_batch - 1)
            new_tokens, sources, step = self._step(limit)
            # The step's tokens up to whatever ends the reply, settled (tokens, caches, figures) before
            # any is yielded: a caller may stop reading at any event.
            given: list[TokenEvent] = []
            used = 0
            for token, source in zip(new_tokens, sources):
                used += 1
                if tokenizer.is_end_of_generation(token):
                    reason = "eog"
                    break
                given.append(TokenEvent(token, text.push(tokenizer.token_bytes(token)), source))
                if text.stopped:
                    reason = "stop"
                    break
                if stats.generated + len(given) >= limits.max_tokens:
                    reason = "max_tokens"
                    break
            self._forget_unused(len(new_tokens) - used)
            step = step.cut_to(used)
            stats.add(step)
            stats.generated += len(given)
            yield step
            yield from given
        yield DoneEvent(reason, stats, text.flush())

    def _forget_unused(self, count: int) -> None:
        """Drop accepted tokens past the stopping point, so `tokens` is what the user was shown
        (plus the end-of-generation token, if that ended it) and a next turn continues from there."""
        if count:
            del self.tokens[-count:]
            self._forget(len(self.tokens) - 1)

    def _forget(self, n_tokens: int) -> None:
        """Make every cache hold at most the first n_tokens of `tokens`."""
        self.target.truncate(min(self.target.n_past, n_tokens))
        if self.drafter is not None:
            self.drafter.forget(n_tokens)

    def _prefill(self, prompt: Sequence[int], stop_requested: Callable[[], bool]) -> bool:
        """Make every cache hold prompt[:-1], keeping the longest prefix it already holds, a batch at a
        time; False where `stop_requested()` stopped it before a batch (the first included). When the
        policy has no costs yet, give it the pair's, measuring them here if need be: set-up, like the prompt."""
        if not prompt:
            raise SpeccliError("the prompt is empty")
        n_ctx = self.target.n_ctx
        if len(prompt) > n_ctx:
            raise SpeccliError(f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}; raise --ctx")
        shared = self.reused_prefix(prompt)
        # `tokens` follows what every cache is known to hold, batch by batch: if a decode fails half-way,
        # the next call must not trust what it left behind; if the prefill is stopped, the next call
        # with this prompt (Ctrl-C, then the message sent again) goes on from where it stopped.
        self._forget(shared)
        self.tokens = list(prompt[: shared + 1])  # the caches hold `shared` tokens; the next one is pending
        for end in range(self.target.n_past + self.target.n_batch, len(prompt) - 1 + self.target.n_batch, self.target.n_batch):
            if stop_requested():
                return False
            held = prompt[: min(end, len(prompt) - 1) + 1]  # the caches will hold all but its last token
            self.target.decode(held[self.target.n_past : -1], n_logit_rows=0)
            if self.drafter is not None:
                self.drafter.sync(held)
            self.tokens = list(held)
        if self.drafter is not None:
            self.drafter.sync(prompt)  # a prompt the target held already may be new to the drafter
        self.tokens = list(prompt)
        if self.drafter is not None and self.policy.needs_costs:
            self.policy.calibrate(self.costs.profile(self.tokens, self.policy.profiled_sizes, self.sampling))
        return True

    def _step(self, limit: int) -> tuple[list[int], list[Source], StepEvent]:
        """Draft up to `limit` tokens, verify them in one target decode, keep the accepted prefix and one more."""
        started, computed_before = time.perf_counter(), COMPUTE_CLOCK.seconds
        draft = Draft()
        if self.drafter is not None and limit > 0:
            draft = self.drafter.draft(self.tokens, limit, self.sampling, self.rng, self.policy, self._constraint)
        draft_seconds = time.perf_counter() - started
        proposed = draft.tokens
        k = len(proposed)
        target_started = time.perf_counter()
        target_logits = self.target.decode(self.tokens[self.target.n_past :] + proposed, n_logit_rows=k + 1)
        target_seconds = time.perf_counter() - target_started
        verdict = self._verify(proposed, draft.q, target_logits)
        new_tokens = proposed[: verdict.n_accepted] + [verdict.next_token]
        if self._constraint is not None:
            self._constraint.settle(new_tokens)
        self.tokens += new_tokens
        # Forget the rejected drafts; the new last token stays pending for the next step.
        self._forget(len(self.tokens) - 1)
        sources = [Source.DRAFT] * verdict.n_accepted + [_source_of_next(verdict, k)]
        other_seconds = time.perf_counter() - started - draft_seconds - target_seconds
        taken_over = draft.continuation
        prompt_seconds = draft.prompt_seconds  # the prefill's, deferred to the first draft
        step = StepEvent(
            drafted=k, accepted=verdict.n_accepted, draft_seconds=draft_seconds - prompt_seconds,
            target_seconds=target_seconds, other_seconds=other_seconds, source=draft.source or None,
            catch_up_seconds=draft.catch_up_seconds,
            compute_seconds=max(0.0, COMPUTE_CLOCK.seconds - computed_before - prompt_seconds),
            prompt_seconds=prompt_seconds,
            continuation=(taken_over.source, len(taken_over.tokens)) if taken_over else None,
            forced=len(draft.forced), companion_rows=self.target.companion_rows,
        )
        if self.drafter is not None:
            self.drafter.observe(draft, step, new_tokens, self.policy)
        return new_tokens, sources, step

    def _verify(self, proposed: list[int], q: list[Distribution | None] | None, target_logits: np.ndarray) -> DraftVerdict:
        """q: the distributions the first len(q) proposed tokens were drawn from (None: all proposed with
        certainty). Under a grammar each row is read through its mask (core/constraint.py)."""
        argmax = read = None
        if self._constraint is not None:
            rows = ConstrainedRows(target_logits, self._constraint, proposed)
            argmax, read = rows.greedy_token, rows.distribution
        if self.sampling.greedy:
            return verify_greedy(proposed, target_logits, argmax)
        p = RowDistributions(target_logits, self.sampling, self._target_row, read)
        if not proposed:
            return DraftVerdict(0, sample(p[0], self.rng))
        return verify_sampled(proposed, q, p, self.rng)


class PairCosts:
    """The one place a pair's cost profile is entered: timed (`measure_costs`) the first time it is asked
    for verify sizes not yet asked for, at the caches' end then, and shared by every generator the
    caller gives it to (a chat's, serve's configurations). Bench gives its median over the run instead
    (`given`), which is never timed again."""

    def __init__(self, target: Model, drafter: Drafting | None, given: CostProfile | None = None) -> None:
        self.target, self.drafter, self.measured = target, drafter, given
        self._asked: set[int] | None = set() if given is None else None  # None: given, never timed here

    def due(self, sizes: Sequence[int]) -> bool:
        """Would asking for these sizes time the profile?"""
        return self._asked is not None and (self.measured is None or not self._asked.issuperset(sizes))

    def profile(self, context: Sequence[int], sizes: Sequence[int], sampling: SamplingParams) -> CostProfile:
        if self.due(sizes):
            self._asked.update(sizes)  # a size that does not fit the context is asked once, not timed
            self.measured = measure_costs(self.target, self.drafter, context, sorted(self._asked), sampling)
        return self.measured

    @property
    def asked(self) -> list[int]:
        """The verify sizes the profile was asked for (some may not have fitted): what a later process
        may ask for without timing it again."""
        return sorted(self._asked or ())

    def remember(self, profile: CostProfile, asked: Sequence[int]) -> None:
        """Take up the profile an earlier process of this pair timed on this machine for `asked`
        (speccli/remembered): timing it holds up a process's first reply by seconds where a target
        step is slow (docs/results.md), and each step's own timing still moves the curve's level."""
        if self._asked is not None and self._asked <= set(asked):  # it covers all this process asked
            self.measured, self._asked = profile, set(asked)


def measure_costs(
    target: Model, drafter: Drafting | None, context: Sequence[int], sizes: Sequence[int], sampling: SamplingParams,
) -> CostProfile:
    """The pair's cost profile, timed at the caches' end (which then hold what they held): a target decode
    of n logit rows for 1 and each of `sizes` that fits (in the context and one batch), a draw from one
    row, and the drafter's own costs (`Drafter.costs`, timed as the drafter sees fit). Each target timing
    is the least of PROFILE_TIMINGS: the first decode pays set-up, and what else the machine does only
    ever lengthens one (a slow one had made chat's estimated speedup 49x at an acceptance of 0%).
    Copies of the context's last token are decoded: cost does not depend on them."""
    fits = sorted({n for n in (1, *sizes) if target.n_past + n <= target.n_ctx and n <= target.n_batch})
    token = [context[-1]]
    decode_seconds = {n: min(target.time_decode(token * n, n_logit_rows=n) for _ in range(PROFILE_TIMINGS)) for n in fits}
    start = target.n_past
    try:
        row = target.decode(token, n_logit_rows=1)
        rng = np.random.default_rng(0)
        draws = []
        for _ in range(PROFILE_TIMINGS):
            started = time.perf_counter()
            sample(distribution(row[0], sampling), rng)
            draws.append(time.perf_counter() - started)
    finally:
        target.truncate(start)
    draft_costs = drafter.costs(context) if drafter is not None else {}
    return CostProfile(decode_seconds, draft_costs, min(draws))


def _source_of_next(verdict: DraftVerdict, k: int) -> Source:
    if k == 0:  # no drafts this step (target alone, or drafting did not pay, or no room)
        return Source.TARGET
    return Source.BONUS if verdict.is_bonus(k) else Source.CORRECTION
