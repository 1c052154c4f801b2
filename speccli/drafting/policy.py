"""How many tokens to draft each step: a fixed K, or `auto`, chosen from this machine's own costs.

`auto` picks, before each step, the draft length k (0: a plain target decode) that maximises

    E(k) = 1 + sum_{i=1..k} prod_{j<=i} a_j        tokens a step yields (its correction/bonus included)
    T(k) = C(m) + k * d + V(k+1) + E(k) * C(P) / N  seconds: a catch-up of m skipped tokens, k drafted
                                                    tokens, a verify, a share of the prompt still owed
    k*   = argmax_k E(k) / T(k)

a_j per proposal key (acceptance.py); d, C(m), V(n) measured per pair, refreshed by every step
(costs.py); C(P), a draft model's one-time intake of the prompt, spread over the N tokens it is expected
to yield. The rules on top (ramps, re-checks, the reply's lookup scale) are
docs/drafting.md's, each measured in tests/benchmarks/RESULTS.md. `plan` changes nothing and reads only
what is known before the step's verification, so the output distribution stays the target's; `observe`
is the one place the policy learns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from speccli.core.seam import CostProfile, Draft, NO_PLAN, Plan, ReplyDrafting, Segment
from speccli.core.stats import StepEvent
from speccli.drafting.acceptance import MEMORY, PRIOR_ACCEPTANCE, PRIOR_WEIGHT, RECENCY, Acceptance
from speccli.drafting.costs import DraftCost, VerifyCosts
from speccli.util.sequences import common_prefix_length

AUTO_MAX_K = 24  # each verified row is a row of llama.cpp's output buffer; past 24 a CPU's verify rarely pays
PROFILED_SIZES = (1, 2, 4, 8, 16, AUTO_MAX_K + 1)  # verify sizes timed once per pair
# A key's first draft in a reply is at most RAMP_START tokens, each next at most twice what the last kept.
RAMP_START = 4
# A lookup may start (and never falls below) the longest draft whose complete failure costs at most
# RAMP_LOSS plain steps more than a plain step, plus one per token its whole drafts kept in a row; a
# draft model is re-checked where what it skipped costs at most RAMP_LOSS plain steps to take in.
RAMP_LOSS = 1.0
# Idle steps of a key before a re-check of PROBE_LENGTH tokens, doubling: the estimates' memory.
FIRST_PROBE_AFTER = MEMORY
PROBE_LENGTH = 2
# A re-check weighs the key's earlier evidence by this: it asks whether this text differs.
RECHECK_CARRY = 0.25
LONG_RECENCY = 0.95  # the memory of a draft model not ramped (its best length at the prior is past RAMP_START)


class FixedK:
    """Draft K tokens every step (fewer only where the context or the reply has no room)."""

    needs_costs = False
    profiled_sizes = ()
    reply = None

    def __init__(self, k: int) -> None:
        self.k = k
        self.name = str(k)

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        return Plan(min(self.k, available))

    def calibrate(self, costs: CostProfile) -> None:
        pass

    def begin_reply(self) -> None:
        pass

    def observe(self, draft: Draft, step: StepEvent, yielded: Sequence[int]) -> None:
        pass


@dataclass
class Schedule:
    """A key's drafting within and across replies: what its ramp allows, when it is re-checked."""

    idle_steps: int = 0  # steps in a row without a draft of this key
    idle_replies: int = 0  # replies in a row, before this one, without one
    asked_in_reply: bool = False
    drafted_in_reply: bool = False
    failed_probes: int = 0  # re-checks in a row after which drafting still did not pay
    last_kept: int | None = None  # tokens its last draft in this reply led to (None: none yet)
    last_kept_whole: bool = False
    last_drafted: int = 0  # tokens its last draft drafted itself
    copied: int = 0  # tokens its drafts in this reply kept in a row, each kept whole

    def begin_reply(self) -> None:
        self.idle_replies = 0 if self.drafted_in_reply else self.idle_replies + 1
        self.asked_in_reply = self.drafted_in_reply = False
        self.last_kept, self.last_kept_whole, self.copied = None, False, 0

    def kept(self, run: int, whole: bool, drafted: int) -> None:
        """Its last draft of `drafted` tokens led to `run` tokens kept; `whole`: all of its tokens."""
        self.last_kept, self.last_kept_whole, self.last_drafted = run, whole, drafted
        self.copied = self.copied + run if whole else 0

    def asked(self, k: int) -> None:
        self.asked_in_reply = True
        self.idle_steps = 0 if k else self.idle_steps + 1
        self.drafted_in_reply |= k > 0

    def backoff(self) -> int:
        return 2 ** min(self.failed_probes, 8)

    def explore(self, k: int, longest: int) -> int:
        return k  # the length drafted where the estimates chose k


@dataclass
class ModelSchedule(Schedule):
    """A draft model: ramped from RAMP_START in each reply (unless unramped); re-checked where a reply
    first asks it and after idle steps within a reply (two misses must not rule it out for the reply:
    docs/gpu.md), once measured only where what it skipped is cheap to take in (RESULTS.md)."""

    unramped: bool = False  # its best length at the prior is past RAMP_START: its estimates alone set it
    share: float = 1.0  # of a reply's tokens from its first draft on, the share its steps yielded
    yielded_by_it: int = 0  # this reply's tokens from steps it drafted,
    yielded_since_its_first: int = 0  # and all of this reply's since its first draft

    def begin_reply(self) -> None:
        super().begin_reply()
        self.idle_steps = 0  # a re-check within a reply counts that reply's steps only
        if self.yielded_since_its_first:
            self.share += (1 - RECENCY) * (self.yielded_by_it / self.yielded_since_its_first - self.share)
        self.yielded_by_it = self.yielded_since_its_first = 0

    def count_step(self, drafted_it: bool, tokens: int) -> None:
        """A step of this reply yielded `tokens`, this source's draft or not."""
        self.yielded_by_it += tokens if drafted_it else 0
        self.yielded_since_its_first += tokens if self.yielded_by_it else 0

    def ramp(self, lookup_ramps: Sequence[int]) -> int:
        if self.unramped:
            return AUTO_MAX_K
        if self.last_kept is None:
            return RAMP_START
        return max(1, 2 * self.last_kept)

    def choose(self, rates: list[float], ramp: int) -> int:
        """The best length, or the ramp's where the best is past it. A ramp cut below RAMP_START drafts
        the shortest length up to RAMP_START that pays, or RAMP_START's: a failed draft never ends
        drafting for the reply (RESULTS.md)."""
        best = fastest(rates)
        if best <= ramp:
            return best
        cautious = range(ramp, min(best, max(ramp, RAMP_START)) + 1)
        return next((k for k in cautious if rates[k] > rates[0]), cautious[-1])

    def horizon(self, ramp: int) -> int:
        """The longest length `choose` needs priced: all (the rates need not have one peak: on Qwen's
        CPU curve they fall past 4 rows and rise again)."""
        return AUTO_MAX_K

    def explore(self, k: int, longest: int) -> int:
        """Unramped, a draft kept whole is followed by one a token longer at least: the estimates past
        it are refreshed only by drafting there (RESULTS.md, "Fewer constants")."""
        if self.unramped and k and self.last_kept_whole:
            return max(k, min(self.last_drafted + 1, longest))
        return k

    def probe_due(self) -> bool:
        if not self.asked_in_reply:
            return self.idle_replies >= min(self.backoff(), MEMORY) - 1
        return self.idle_steps >= FIRST_PROBE_AFTER * self.backoff()


class LookupSchedule(Schedule):
    """A lookup: ramped from the lookup start; while its drafts are kept whole (text being copied goes on
    until it stops), as long as the tokens they kept have earned (`AutoK.lookup_ramps`)."""

    def ramp(self, lookup_ramps: Sequence[int]) -> int:
        if self.last_kept is None:
            return lookup_ramps[0]
        if self.last_kept_whole:
            return max(2 * self.last_kept, lookup_ramps[min(self.copied, len(lookup_ramps) - 1)])
        return max(lookup_ramps[0], 2 * self.last_kept)

    def choose(self, rates: list[float], ramp: int) -> int:
        """The best length within the ramp: a long draft past it rests on positions seldom reached."""
        return fastest(rates[: ramp + 1])

    def horizon(self, ramp: int) -> int:
        return ramp

    def probe_due(self) -> bool:
        return self.idle_steps >= FIRST_PROBE_AFTER * self.backoff()


@dataclass
class KeyState:
    schedule: Schedule
    acceptance: Acceptance = field(default_factory=Acceptance)
    cost: DraftCost = field(default_factory=DraftCost)


def fastest(rates: list[float]) -> int:
    """The draft length with the highest expected rate (the shortest among equals)."""
    return max(range(len(rates)), key=rates.__getitem__)


class AutoK:
    """K per step from measured costs and acceptance (see the module docstring)."""

    name = "auto"
    profiled_sizes = PROFILED_SIZES

    def __init__(self) -> None:
        self.max_k = AUTO_MAX_K
        self.verify = VerifyCosts()
        self.keys: dict[str, KeyState] = {}
        self.reply = ReplyDrafting()
        # This reply's lookup first tokens kept, and what the estimates expected (both from PRIOR_WEIGHT
        # kept as expected): their ratio scales every lookup kind's first-token estimate in this reply.
        self.lookup_kept = self.lookup_expected = PRIOR_WEIGHT
        # A lookup's longest draft after its drafts kept m tokens whole, by m (`price_ramps`).
        self.lookup_ramps: list[int] = [RAMP_START]
        self.reply_lengths: list[int] = []  # tokens of the last MEMORY replies
        self.reply_tokens = 0  # of the reply under way

    @property
    def needs_costs(self) -> bool:
        return not self.verify.decode_seconds

    def calibrate(self, costs: CostProfile) -> None:
        self.verify.add_points(costs.decode_seconds)
        for key, draft in costs.draft_costs.items():
            state = self.keys.setdefault(key, KeyState(ModelSchedule()))
            state.cost.calibrate(draft.token_seconds, draft.catch_up_seconds, self.verify.level)
            # Decided from the profile, once: a token's cost learnt from steps holds its draft's fixed part
            # spread over the draft, so short drafts would price it dear and stay short (RESULTS.md).
            rates = self._rates(state, [PRIOR_ACCEPTANCE] * self.max_k)
            state.schedule.unramped = fastest(rates) > RAMP_START
            state.acceptance.recency = LONG_RECENCY if state.schedule.unramped else RECENCY
        self.price_ramps()

    def begin_reply(self) -> None:
        if self.reply_tokens:
            self.reply_lengths = [*self.reply_lengths, self.reply_tokens][-MEMORY:]
        self.reply_tokens = 0
        self.reply = ReplyDrafting()
        self.lookup_kept = self.lookup_expected = PRIOR_WEIGHT
        for state in self.keys.values():
            state.schedule.begin_reply()
        if self.verify.decode_seconds:
            self.price_ramps()

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        limit = min(available, self.max_k)
        state = self.keys.get(key) or KeyState(LookupSchedule())  # a draft model's key exists from calibrate
        intake = self._intake_per_token(state, owed_prompt, available) if owed_prompt else 0.0
        recheck = state.schedule.probe_due() and self._recheck_affordable(state, catch_up, intake)
        if isinstance(state.schedule, ModelSchedule) and state.schedule.idle_steps and not recheck:
            # Nothing learnt of it since it last drafted nothing; only what it skipped grew: not priced.
            return Plan(0, 1.0 / self.verify(1))
        ramp = state.schedule.ramp(self.lookup_ramps)
        # Only the lengths `choose` compares are priced: this runs for every source at every step.
        acceptance = state.acceptance.rates(max(min(limit, state.schedule.horizon(ramp)), 0))
        if isinstance(state.schedule, LookupSchedule) and acceptance:  # as this reply's lookups have fared
            acceptance[0] *= min(1.0, self.lookup_kept / self.lookup_expected)
        rates = self._rates(state, acceptance, catch_up, intake)
        k = state.schedule.choose(rates, ramp)
        if recheck and intake and not k:
            # Ruled out by the prompt it must take in, not by its drafts: a re-check would measure nothing.
            recheck = state.schedule.choose(self._rates(state, acceptance, catch_up), ramp) == 0
        if limit > 0 and not k and recheck and self._could_pay(state, limit):
            return Plan(min(limit, PROBE_LENGTH), rates[k], probe=True)
        return Plan(state.schedule.explore(k, len(rates) - 1), rates[k])  # the rate: the estimates' choice's

    def _intake_per_token(self, state: KeyState, owed_prompt: int, available: int) -> float:
        """Seconds of taking in `owed_prompt` tokens, spread over the tokens the source is expected to
        yield in the rest of the reply (what the last MEMORY replies still had at this length)."""
        done = self.reply_tokens
        longer = [length - done for length in self.reply_lengths if length > done]
        remaining = min(available + 1, sum(longer) / len(longer)) if longer else available + 1
        share = state.schedule.share if isinstance(state.schedule, ModelSchedule) else 1.0
        return state.cost.taking_in(owed_prompt) * self.verify.level / max(1.0, remaining * share)

    def _recheck_affordable(self, state: KeyState, catch_up: int, intake_per_token: float = 0.0) -> bool:
        """A source measured before is re-checked where taking in what it skipped (and its probe's share
        of a prompt owed) costs at most RAMP_LOSS plain steps; one never measured is tried when asked."""
        intake = intake_per_token * (PROBE_LENGTH + 1)  # as `_rates` charges a probe, all kept
        cheap = state.cost.taking_in(catch_up) * self.verify.level + intake <= RAMP_LOSS * self.verify(1)
        return not state.acceptance.judged_at or cheap

    def observe(self, draft: Draft, step: StepEvent, yielded: Sequence[int]) -> None:
        # every row verified, and those of the slots beside it in the same decode
        self.verify.update(step.forced + step.drafted + 1, step.target_seconds, step.other_seconds, step.companion_rows)
        self.reply_tokens += len(yielded)
        first = draft.segments[0] if draft.segments else None
        for key, state in self.keys.items():
            if isinstance(state.schedule, ModelSchedule):
                state.schedule.count_step(first is not None and first.key == key and bool(first.tokens), len(yielded))
        for asked in (*draft.segments, draft.judged):
            if asked is not None and asked.key and asked.plan is not NO_PLAN:
                state = self._state(asked.key)
                if asked.plan.probe:
                    state.acceptance.fade(RECHECK_CARRY)
                state.schedule.asked(asked.plan.k)
        if first is not None:
            if step.drafted:
                self.reply.rechecks += first.plan.probe
                self.reply.chosen += not first.plan.probe
            own = len(first.tokens)
            # A draft taken over after `own` tokens led to every token the step kept: its ramp grows by
            # them all, while its acceptance counts its own tokens only.
            self._learn(first, min(step.accepted, own), step.draft_seconds - step.catch_up_seconds, step.accepted)
            if draft.catch_up_tokens:
                self._state(first.key).cost.learn_catch_up(draft.catch_up_tokens, step.catch_up_seconds, self.verify.level)
            taken_over = draft.continuation
            if taken_over is not None and step.accepted >= own:  # judged only where every token before was kept
                self._learn(taken_over, step.accepted - own, 0.0, step.accepted - own)
        if draft.judged is not None:
            # Proposed with certainty, a token is kept with probability p(x), that of the target yielding
            # it there: comparing it with what the step yielded judges it as verifying would.
            judged = draft.judged
            compared = min(len(judged.tokens), len(yielded))
            self._judge(self._state(judged.key), compared, common_prefix_length(judged.tokens, yielded))

    def _learn(self, segment: Segment, accepted: int, seconds: float, kept_run: int) -> None:
        """One source's share of a step: its tokens drafted in `seconds`, the first `accepted` kept."""
        if not segment.key:
            return
        drafted = len(segment.tokens)
        if not drafted:
            return
        state = self._state(segment.key)
        self._judge(state, drafted, accepted)
        state.schedule.kept(kept_run, kept_run >= drafted, drafted)
        state.cost.learn_token(seconds / drafted / self.verify.level)
        if segment.plan.probe:
            rates = self._rates(state, state.acceptance.rates(self.max_k))
            pays = state.schedule.choose(rates, state.schedule.ramp(self.lookup_ramps)) > 0
            state.schedule.failed_probes = 0 if pays else state.schedule.failed_probes + 1

    def _judge(self, state: KeyState, drafted: int, accepted: int) -> None:
        if isinstance(state.schedule, LookupSchedule) and drafted:  # its first token judged
            self.lookup_expected += state.acceptance.rates(1)[0]
            self.lookup_kept += accepted > 0
        state.acceptance.add(drafted, accepted)

    def _state(self, key: str) -> KeyState:
        return self.keys.setdefault(key, KeyState(LookupSchedule()))

    def _rates(
        self, state: KeyState, acceptance: list[float], catch_up: int = 0, intake_per_token: float = 0.0
    ) -> list[float]:
        """Expected tokens per second of each draft length, 0 (a plain step) included; `intake_per_token`:
        seconds of a prompt to take in first, charged per token the step yields."""
        verify, level = self.verify.curve(len(acceptance) + 1), self.verify.level
        token, catch_up_seconds = (state.cost.token_seconds or 0.0) * level, state.cost.taking_in(catch_up) * level
        rates, tokens, kept_so_far = [1.0 / verify[0]], 1.0, 1.0
        for k, accepted in enumerate(acceptance, 1):
            kept_so_far *= accepted
            tokens += kept_so_far
            rates.append(tokens / (k * token + catch_up_seconds + verify[k] + intake_per_token * tokens))
        return rates

    def _could_pay(self, state: KeyState, limit: int) -> bool:
        """Whether drafting could pay at all at these costs, were every token kept."""
        return fastest(self._rates(state, [1.0] * limit)) > 0

    def price_ramps(self) -> None:
        """A lookup's ramp start and floor, and its ramps by what its copy kept (see RAMP_LOSS)."""
        start = min(RAMP_START, self.max_k)
        self.lookup_ramps = [max(start, self._loss_bound(RAMP_LOSS + copied)) for copied in range(self.max_k + 1)]

    def _loss_bound(self, loss: float) -> int:
        """The longest lookup draft (its tokens free) whose complete failure, a verify of one row more,
        costs at most `loss` plain steps more than a plain step (V never falls as n grows)."""
        bound = (1 + loss) * self.verify(1)
        k = 0
        while k < self.max_k and self.verify(k + 2) <= bound:
            k += 1
        return k

