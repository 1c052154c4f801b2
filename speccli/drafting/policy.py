"""How many tokens to draft each step: a fixed K, or `auto`, chosen from this machine's own costs.

`auto` picks, before each step, the draft length k (0 included: a plain target decode) that
maximises expected tokens per second:

    E(k) = 1 + sum_{i=1..k} prod_{j<=i} a_j        tokens a step yields (its correction/bonus included)
    T(k) = C(m) + k * d + V(k+1)                    seconds: a catch-up, k drafted tokens at d each, a verify
    k*   = argmax_k E(k) / T(k)                     (T(0) = V(1): a plain step catches nothing up)

a_j is the acceptance of draft position j given that 1..j-1 were kept, counted per proposal key
(the draft model; n-gram matches by length and by how they went on before: see ngram.py), recent
drafts weighing most, and shrunk towards the position before it while few have been seen. A position
never judged yet takes the key's continuation rate: what positions past the first have kept, pooled
(the geometric model behind speculative decoding's analysis). So a draft that is always kept grows
past any depth it has tried, however steep the verify curve is there. d is the measured seconds per
drafted token of that key (0 for n-gram lookup). C(m) is what a draft model pays first to take in the
m tokens it skipped while other sources drafted: one batched decode, priced on the line through two
catch-ups timed at calibration, which each real catch-up moves (see `_learn_catch_up`). Unpriced, a
chain asked the model back mid-reply at a cost it did not see (Qwen 0.5B here: 2 tokens cost 0.5 of a
target step, 19 cost 2.4).
V(n) is the target's measured cost of a decode with n logit rows plus the per-row work after it
(probabilities, the verify rule); profiled once per policy at PROFILED_SIZES (1, 2, 4, 8, 16, 25),
interpolated, and refreshed from every step's own timings (the machine's load as a level that scales
the whole curve and d, the curve's shape per size: see VerifyCosts).

A lookup's proposal is judged even where it is not drafted (the estimates chose no tokens of it, or
a chain preferred the draft model): a token proposed with certainty is kept with the probability that
the target yields it there, so comparing the proposal with what the step yielded counts for its key
as verifying it would have, at no cost (`Draft.shadow`). Its estimates then follow the text while it
is not drafting: a key ruled out by failed drafts comes back as soon as its proposals match what the
reply copies, and one whose proposals keep missing is ruled out without paying for verifying them.

What each rule gained or cost, replayed and in bench runs: tests/benchmarks/RESULTS.md, "K per step".

Each reply starts cautiously: a source's acceptance learned on the last reply's text is a guess for
this one, so its long drafts are earned again in each reply (see RAMP_START).

Within the step, a draft model may stop short of k at a token it is unsure of, where unsure tokens
have been mostly rejected (see UNSURE_BELOW); the token withheld counts as rejected in the key's
estimates.

Everything these choices use is known before the step's verification: counts and timings of earlier
steps and what they yielded, how much the draft source has to offer, and the draft model's own
probabilities. None of it depends on the target's verdict on this step's tokens, so the output
distribution stays the target's (tests/test_verify_deterministic.py proves the rule exact for any
such choice; tests/test_engine_distribution.py checks it on real models, the confidence stop included).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from speccli.core.stats import StepEvent
from speccli.drafting.base import Draft, DraftCosts
from speccli.util.sequences import common_prefix_length

# Longest draft `auto` chooses. Each verified row costs a row of logits in llama.cpp's output buffer
# (1 MB at Gemma's 262k-token vocabulary, kept at its largest size), and past ~24 the extra tokens a
# step could yield rarely pay for a wider verify on a CPU; with 24, `--spec ngram` at a 16k-token context
# peaked 35-40 MiB over the target alone (tests/benchmarks/ngram_memory.py and the README).
AUTO_MAX_K = 24
# Verify sizes timed once per policy (bench's runs share one). The largest is the widest verify `auto`
# makes: profiling more rows would grow that buffer for nothing (32 rows: 7 MB more at Gemma's vocabulary).
PROFILED_SIZES = (1, 2, 4, 8, 16, AUTO_MAX_K + 1)
PRIOR_ACCEPTANCE = 0.9  # optimistic, so that a new source is tried before its costs rule it out
PRIOR_WEIGHT = 2.0  # in judged drafts
# Each new judged draft of a key weighs the earlier ones by this (a memory of ~10 drafts): acceptance
# moves with the text (code, then prose; a chat's next question), and the estimates must follow it.
RECENCY = 0.9
TIMING_WEIGHT = 0.2  # how much one step's timing moves a cost estimate (the level, a size's shape, d)
# A reply's text may differ from the last one's (code, then prose), and a draft model's acceptance was
# learnt on that text: a long draft on a wrong guess costs a decode per token for a token or two kept
# (Gemma: a 22-token draft that kept 2 cost a quarter of a 48-token summary). So in each reply a draft
# model drafts at most RAMP_START tokens, and then at most twice the run its last draft kept (one where it
# kept none): long drafts are earned (as TCP's slow start earns its window, and halves it on a loss), at
# the price of two or three more verifies where the guess was right. After a draft that kept nothing the
# next is as short as pays (Qwen's summary after code: two 4-token drafts kept nothing, each 2.7 target
# steps of cost for one token, 11% of a 48-token reply; now 4 then 2). Within a reply the same holds
# where the text's later draft positions fare worse than the estimates from other text (Gemma's story:
# 16-token drafts kept 3, while 4-token drafts kept nearly all). Lookups are ramped too, though their
# keys are the length of a match in this very text: unramped, a Gemma table reply began with a 21-token
# lookup that kept 2 and an 11-token one that kept none (the chain 1.81x against 1.83x ramped, A/B). A
# lookup's failed draft costs verify rows but no decodes, so its ramp starts at, and is never cut below,
# RAMP_START or, where verify rows are cheap, the longest draft whose verify costs at most
# LOOKUP_RAMP_LOSS plain steps more than a plain step on the measured curve (V(k+1) <= (1 +
# LOOKUP_RAMP_LOSS) V(1)): 8 tokens on Gemma's F32 target here, 3 or 4 on Qwen 1.5B, so RAMP_START
# there. Once a lookup's draft is kept whole, its key's estimates alone choose its length until one of
# its drafts is not: a match kept whole is text being copied, which goes on until it stops, and doubling
# from there only added verifies on the way (at a cost where a copy stops short: Qwen's held-out
# `explain`, where a 24-token lookup kept 5). Any draft kept whole counts, however short. A draft model
# kept whole, unramped the same way, lost on Gemma's held-out prompts.
RAMP_START = 4
LOOKUP_RAMP_LOSS = 1.0
FIRST_PROBE_AFTER = 16  # steps that chose 0 for a lookup key before drafting 2 tokens to re-check it
# A draft model ruled out is re-checked at the start of a reply, every 2, 4 and at most every 8 replies
# while its re-checks fail: one costs some 3% of a short reply, and a chat that turns to code should
# find its draft model again within a few turns.
MAX_REPLIES_BETWEEN_CHECKS = 8
# A re-check weighs what the key had measured by RECHECK_CARRY: that evidence is what ruled the key out,
# and the re-check asks whether this text differs. Otherwise two kept tokens could never outweigh ten
# failed drafts, and a draft model ruled out on prose stayed out through code (Qwen: K=4 paid 1.25-1.38x
# on the structured tasks while `auto` drafted on 34 of 1,017 steps).
RECHECK_CARRY = 0.25
# A draft model's top probability for its next token (at temperature 1 for greedy drafts; its q row's
# top when sampling) marks the token unsure below UNSURE_BELOW (llama.cpp's p_min, where it always
# stops). Whether unsure tokens are worth drafting depends on the pair: a quantized copy of the target
# agrees with it even where both are unsure (Gemma 3 270M: 0.99 kept), a smaller model often does
# not. So each key measures how often its unsure tokens are kept, and a draft stops at an unsure
# token only while that is below UNSURE_STOP_BELOW. Before any is judged the estimate is UNSURE_PRIOR:
# a key drafts unsure tokens until one is rejected (then 0.4) and its next is kept. The measurement
# fades with RECENCY at each step the key drafts, so a key that stopped drafts unsure tokens again
# some ten steps later, and measures them anew.
UNSURE_BELOW = 0.75
UNSURE_STOP_BELOW = 0.5
UNSURE_PRIOR = 0.6


@dataclass
class ReplyDrafting:
    """The verified drafts of the reply under way: chosen on the estimates, or re-checks of a source the
    estimates had ruled out (chat says so where a reply had none of the former)."""

    chosen: int = 0
    rechecks: int = 0


class KPolicy(Protocol):
    name: str  # "4", "auto"
    needs_costs: bool  # whether `calibrate` must run before the next step (once per policy)
    reply: ReplyDrafting | None  # None where every draft is the one asked for (a fixed K)

    def begin_reply(self) -> None:
        """A new reply (a prompt, a chat turn) starts: its text may not be like the last one's."""

    def length_for(self, key: str, available: int, catch_up: int) -> int:
        """Tokens to draft of `available`, where the source must first take in `catch_up` skipped tokens.
        This is the step's one ask of the key: it counts it (steps without drafts, re-checks due)."""

    def length_if_asked(self, key: str, available: int, catch_up: int) -> int:
        """What `length_for` would choose on the estimates, without counting an ask or re-checking: a
        chain's question, while a draft model drafts, whether a lookup would take over."""

    def keep_drafting(self, key: str, confidence: Callable[[], float]) -> bool:
        """Whether a source that is this sure of its next token (`confidence()`) should still propose it."""

    def calibrate(self, verify_seconds: dict[int, float], draft_costs: dict[str, DraftCosts]) -> None: ...

    def observe(self, draft: Draft, step: StepEvent) -> None:
        """What `draft` (this step's, verified) yielded and cost."""

    def observe_unverified(self, shadow: Draft, yielded: Sequence[int]) -> None:
        """A free source's proposal this step did not verify (`Draft.shadow`), and the tokens the step
        yielded (kept drafts, then the target's own)."""

    def best_rate(self, key: str, available: int, catch_up: int) -> float | None:
        """Expected tokens per second of the draft length `length_for` would choose for `key` now,
        without choosing it; None where the policy keeps no estimates (a fixed K)."""


class FixedK:
    """Draft K tokens every step (fewer only where the context or the reply has no room)."""

    needs_costs = False
    reply = None

    def __init__(self, k: int) -> None:
        self.k = k
        self.name = str(k)

    def begin_reply(self) -> None:
        pass

    def length_for(self, key: str, available: int, catch_up: int = 0) -> int:
        return min(self.k, available)

    length_if_asked = length_for

    def keep_drafting(self, key: str, confidence: Callable[[], float]) -> bool:
        return True  # K tokens every step, as asked: the confidence is never computed

    def calibrate(self, verify_seconds: dict[int, float], draft_costs: dict[str, DraftCosts]) -> None:
        pass

    def observe(self, draft: Draft, step: StepEvent) -> None:
        pass

    def observe_unverified(self, shadow: Draft, yielded: Sequence[int]) -> None:
        pass

    def best_rate(self, key: str, available: int, catch_up: int = 0) -> float | None:
        return None


@dataclass
class VerifyCosts:
    """V(n): seconds of one target decode with n logit rows, plus per-row work, from measured points.

    Timings on a shared machine are noisy one way only: something else running makes a decode
    slower, never faster. So one step's timing moves the estimates by at most a bounded step (clipped
    at twice the estimate), and the curve read from the points is the largest non-decreasing one under
    them: a spike at one size is pulled down by the sizes above it.

    Load slows every size alike, but steps measure mostly the sizes chosen most (one row, where
    drafting does not pay): a curve refreshed size by size would compare a one-row cost measured under
    today's load with a four-row cost from the profile, and draft where it cannot pay (measured: Qwen
    n-gram drafts on prose, 0.91x). So each timing moves a level that scales the whole curve, and what
    the level does not explain refines the curve's shape at that size (the smallest size's timings
    set the level alone: it anchors the shape).
    """

    decode_seconds: dict[int, float] = field(default_factory=dict)  # the curve's shape, at level 1
    level: float = 1.0  # how much slower than that shape every decode runs now
    per_row_seconds: float = 0.0

    def __call__(self, n: int) -> float:
        return self.decode(n) + self.per_row_seconds * n

    def decode(self, n: int) -> float:
        """The decode part of V(n), from the measured points."""
        return self.level * self._shape(n)

    def _shape(self, n: int) -> float:
        sizes = sorted(self.decode_seconds)
        values = [self.decode_seconds[size] for size in sizes]
        for i in range(len(values) - 2, -1, -1):
            values[i] = min(values[i], values[i + 1])
        at = bisect.bisect_left(sizes, n)
        if len(sizes) == 1:  # a context too full to profile more: assume cost grows with rows
            return values[0] * n / sizes[0]
        if at < len(sizes) and sizes[at] == n:
            return values[at]
        # Interpolate between the neighbours, or extend the nearest segment's slope.
        if 0 < at < len(sizes):
            low, high = at - 1, at
        else:
            low, high = (len(sizes) - 2, len(sizes) - 1) if at else (0, 1)
        slope = (values[high] - values[low]) / (sizes[high] - sizes[low])
        return max(values[low] + slope * (n - sizes[low]), values[0])

    def update(self, n: int, decode_seconds: float, other_seconds: float) -> None:
        if not self.decode_seconds:  # nothing profiled (a context too full): this is the curve
            self.decode_seconds[n] = decode_seconds / self.level
        else:
            expected = self.decode(n)
            observed = min(decode_seconds, 2 * expected)
            self.level *= 1 + TIMING_WEIGHT * (observed / expected - 1)
            if n > min(self.decode_seconds):  # the smallest size anchors the shape: its timings are the level's
                shape = self.decode_seconds.get(n, self._shape(n))
                self.decode_seconds[n] = shape + TIMING_WEIGHT * (observed / self.level - shape)
        self.per_row_seconds += TIMING_WEIGHT * (other_seconds / n - self.per_row_seconds)


@dataclass
class KeyHistory:
    """Per position j: steps that judged draft j+1 (drafted it, kept 1..j), and steps that kept it,
    each weighted by its recency."""

    judged_at: list[float] = field(default_factory=list)
    kept_at: list[float] = field(default_factory=list)
    token_seconds: float | None = None  # seconds per drafted token, at the verify curve's level 1 (load slows both)
    # Seconds to take in n skipped tokens, catch_up_fixed + catch_up_per_token * n, at level 1.
    catch_up_fixed: float = 0.0
    catch_up_per_token: float = 0.0
    # Its drafter reported a decode cost per token at calibration (a lookup reports none). Not told by a
    # measured cost: a lookup's steps take microseconds, not nothing, and were once taken for a draft
    # model's (ramped, and re-checked only at a reply's start).
    is_draft_model: bool = False
    idle_steps: int = 0  # steps in a row that drafted nothing from this key
    idle_replies: int = 0  # replies in a row, before this one, in which this key drafted nothing
    asked_in_reply: bool = False
    drafted_in_reply: bool = False
    probing: bool = False  # the current draft is a re-check the estimates alone would not make
    stopped_short: bool = False  # this step's draft stopped before the length chosen (the source grew unsure)
    confidences: list[float] = field(default_factory=list)  # this step's drafted tokens' confidences, in order
    unsure_judged: float = 0.0  # unsure draft tokens judged, and kept, weighted by recency
    unsure_kept: float = 0.0
    failed_probes: int = 0  # re-checks in a row after which drafting still did not pay
    last_kept_in_reply: int | None = None  # tokens this key's last draft in this reply kept (None: none yet)
    last_kept_whole: bool = False  # and whether that was every token it drafted (read for lookups only)

    def add(self, drafted: int, accepted: int) -> None:
        """One step: `drafted` tokens (a withheld one included), the first `accepted` of them kept."""
        judged = min(drafted, accepted + 1)
        self.fade(RECENCY)
        while len(self.judged_at) < judged:
            self.judged_at.append(0.0)
            self.kept_at.append(0.0)
        for position in range(judged):
            self.judged_at[position] += 1
            self.kept_at[position] += position < accepted
        for position, confidence in enumerate(self.confidences[:judged]):  # a withheld token has none
            if confidence < UNSURE_BELOW:
                self.unsure_judged += 1
                self.unsure_kept += position < accepted

    def fade(self, weight: float) -> None:
        """Weigh everything counted so far by `weight`: what comes next counts for more."""
        self.judged_at = [weight * count for count in self.judged_at]
        self.kept_at = [weight * count for count in self.kept_at]
        self.unsure_judged *= weight
        self.unsure_kept *= weight

    def unsure_tokens_pay(self) -> bool:
        return shrunk(self.unsure_kept, self.unsure_judged, UNSURE_PRIOR) >= UNSURE_STOP_BELOW

    def acceptance(self, positions: int) -> list[float]:
        """a_1 .. a_positions: each judged position's rate, shrunk towards the one before it (the first
        towards the key's pooled rate); a position never judged gets the continuation rate (positions
        past the first, pooled). A draft that is mostly all-or-nothing (a lookup is either the text
        being copied or not) then keeps a low first rate but a high continuation rate, as it should."""
        pooled = shrunk(sum(self.kept_at), sum(self.judged_at), PRIOR_ACCEPTANCE)
        continuation = shrunk(sum(self.kept_at[1:]), sum(self.judged_at[1:]), PRIOR_ACCEPTANCE)
        rates, previous = [], pooled
        for position in range(positions):
            if position < len(self.judged_at):
                previous = shrunk(self.kept_at[position], self.judged_at[position], previous)
            elif position:
                previous = continuation
            rates.append(previous)
        return rates


def fastest(rates: list[float]) -> int:
    """The draft length with the highest expected rate (the shortest among equals)."""
    return max(range(len(rates)), key=rates.__getitem__)


def shrunk(kept: float, judged: float, prior: float) -> float:
    """kept / judged, pulled towards `prior` as if PRIOR_WEIGHT more drafts had been judged at that rate."""
    return (kept + PRIOR_WEIGHT * prior) / (judged + PRIOR_WEIGHT)


class AutoK:
    """K per step from measured costs and acceptance (see the module docstring)."""

    name = "auto"

    def __init__(self) -> None:
        self.max_k = AUTO_MAX_K
        self.verify = VerifyCosts()
        self.keys: dict[str, KeyHistory] = {}
        self._lookup_start: int | None = None  # the lookups' ramp start, priced once per reply
        self.reply = ReplyDrafting()

    @property
    def needs_costs(self) -> bool:
        return not self.verify.decode_seconds

    def calibrate(self, verify_seconds: dict[int, float], draft_costs: dict[str, DraftCosts]) -> None:
        self.verify.decode_seconds.update(verify_seconds)
        for key, costs in draft_costs.items():
            history = self._history(key)
            history.token_seconds = costs.token_seconds / self.verify.level
            history.is_draft_model = True
            points = sorted(costs.catch_up_seconds.items())
            if points:  # the line through the smallest and largest sizes timed, or from 0 through one
                (low, low_seconds), (high, high_seconds) = points[0] if len(points) > 1 else (0, 0.0), points[-1]
                per_token = max(0.0, (high_seconds - low_seconds) / (high - low))
                history.catch_up_per_token = per_token / self.verify.level
                history.catch_up_fixed = max(0.0, low_seconds - per_token * low) / self.verify.level

    def begin_reply(self) -> None:
        self._lookup_start = None
        self.reply = ReplyDrafting()
        for history in self.keys.values():
            history.idle_replies = 0 if history.drafted_in_reply else history.idle_replies + 1
            history.asked_in_reply = history.drafted_in_reply = False
            history.last_kept_in_reply = None
            history.last_kept_whole = False

    def length_for(self, key: str, available: int, catch_up: int = 0) -> int:
        history = self._history(key)
        history.stopped_short = False
        history.confidences = []
        limit = min(available, self.max_k)
        if limit <= 0:
            return 0
        first_ask = not history.asked_in_reply
        history.asked_in_reply = True
        best = self.length_if_asked(key, limit, catch_up)
        history.probing = best == 0 and self._worth_probing(history, limit, first_ask)
        if history.probing:
            history.fade(RECHECK_CARRY)
            best = min(limit, 2)
        history.idle_steps = 0 if best else history.idle_steps + 1
        history.drafted_in_reply |= best > 0
        return best

    def length_if_asked(self, key: str, available: int, catch_up: int = 0) -> int:
        limit = min(available, self.max_k)
        if limit <= 0:
            return 0
        history = self._history(key)
        return self._choice(history, history.acceptance(limit), catch_up)

    def keep_drafting(self, key: str, confidence: Callable[[], float]) -> bool:
        history = self._history(key)
        sure = confidence()
        # A re-check is there to measure the key: it does not stop on the draft's own doubts.
        if sure < UNSURE_BELOW and not history.probing and not history.unsure_tokens_pay():
            history.stopped_short = True
            return False
        history.confidences.append(sure)
        return True

    def observe(self, draft: Draft, step: StepEvent) -> None:
        self.verify.update(step.drafted + 1, step.target_seconds, step.other_seconds)
        if step.drafted:
            if self._history(draft.key).probing:
                self.reply.rechecks += 1
            else:
                self.reply.chosen += 1
        own = len(draft.tokens)
        # A draft taken over after `own` tokens led to every token the step kept: its ramp grows by
        # them all, while its acceptance counts its own tokens only.
        self._learn(draft.key, own, min(step.accepted, own), step.draft_seconds - step.catch_up_seconds, step.accepted)
        if draft.catch_up_tokens:
            self._learn_catch_up(self._history(draft.key), draft.catch_up_tokens, step.catch_up_seconds)
        taken_over = draft.continuation
        if taken_over is not None:  # asked quietly (`length_if_asked`): its draft counts as its step's ask
            history = self._history(taken_over.key)
            history.asked_in_reply = history.drafted_in_reply = True
            history.idle_steps = 0
            if step.accepted >= own:  # judged only where every token before it was kept
                accepted = step.accepted - own
                self._learn(taken_over.key, len(taken_over.tokens), accepted, 0.0, accepted)

    def observe_unverified(self, shadow: Draft, yielded: Sequence[int]) -> None:
        # A proposal made with certainty is kept, token by token, with the probability that the target
        # yields that token there (p(x), the verify rule for a certain draft): comparing it with what
        # the step yielded judges it as verifying it would have, one yielded token at a time.
        compared = min(len(shadow.tokens), len(yielded))
        self._history(shadow.key).add(compared, common_prefix_length(shadow.tokens, yielded))

    def _learn(self, key: str, tokens: int, accepted: int, seconds: float, kept_run: int) -> None:
        """One source's share of a step: `tokens` drafted in `seconds`, the first `accepted` kept."""
        if not key:
            return
        history = self._history(key)
        # A token decoded but withheld (the source was unsure) counts as drafted and, where every token
        # before it was kept, as rejected: that is what stopping there yielded, and what it cost.
        drafted = tokens + history.stopped_short
        if not drafted:
            return
        history.add(drafted, accepted)
        history.last_kept_in_reply = kept_run
        history.last_kept_whole = kept_run >= drafted
        per_token = seconds / drafted / self.verify.level
        known = history.token_seconds
        history.token_seconds = per_token if known is None else known + TIMING_WEIGHT * (per_token - known)
        if history.probing:
            pays = self._choice(history, history.acceptance(self.max_k)) > 0
            history.failed_probes = 0 if pays else history.failed_probes + 1

    def best_rate(self, key: str, available: int, catch_up: int = 0) -> float | None:
        history = self._history(key)
        acceptance = history.acceptance(min(available, self.max_k))
        choice = self._choice(history, acceptance, catch_up)
        return self._rate(history, acceptance, choice, catch_up)

    def _learn_catch_up(self, history: KeyHistory, tokens: int, seconds: float) -> None:
        """A catch-up of `tokens` took `seconds`: scale the line towards it, as a step's timing moves the
        verify curve (bounded: clipped at twice what was expected)."""
        expected = (history.catch_up_fixed + history.catch_up_per_token * tokens) * self.verify.level
        if expected > 0:
            scale = 1 + TIMING_WEIGHT * (min(seconds, 2 * expected) / expected - 1)
            history.catch_up_fixed *= scale
            history.catch_up_per_token *= scale

    def _choice(self, history: KeyHistory, acceptance: list[float], catch_up: int = 0) -> int:
        """The draft length that maximises expected tokens per second, within the source's ramp in
        this reply. Where the best length is past the ramp, a draft model drafts the ramp's length: that
        is how it is earned. A lookup drafts the length within its ramp that pays best, none where none
        pays: its best length past the ramp rests on positions its drafts seldom reach, taken at the
        key's continuation rate, and on a steep verify curve (Qwen 1.5B on an idle CPU: 2 rows 1.72
        plain steps, 4 rows 2.79) that lone long draft looked best while every length the ramp allowed
        lost. A draft model's ramp cut below RAMP_START by a failed draft may allow too short a draft
        to pay (one token on a compute-bound target): then the shortest length up to RAMP_START that
        pays, or RAMP_START's where none does, so a cut never ends drafting for the reply (drafting
        only what pays within the cut, as lookups do, ended it)."""
        ramp = self._ramp_limit(history)
        if not history.is_draft_model:  # the lengths past its ramp are not its to draft: not priced
            return fastest(self._rates(history, acceptance[:ramp], catch_up))
        rates = self._rates(history, acceptance, catch_up)
        best = fastest(rates)
        if best <= ramp:
            return best
        cautious = range(ramp, min(best, max(ramp, RAMP_START)) + 1)
        return next((k for k in cautious if rates[k] > rates[0]), cautious[-1])

    def _ramp_limit(self, history: KeyHistory) -> int:
        """The longest draft a source may make now in this reply: at first RAMP_START for a draft model
        and the lookup's start (RAMP_START or more) for a lookup, then twice what its last draft kept, but
        at least one for a draft model and the start for a lookup; no limit for a lookup whose last draft
        was kept whole (see RAMP_START)."""
        start = RAMP_START if history.is_draft_model else self._lookup_ramp_start()
        if history.last_kept_in_reply is None:
            return start
        if history.last_kept_whole and not history.is_draft_model:
            return self.max_k
        return max(1 if history.is_draft_model else start, 2 * history.last_kept_in_reply)

    def _lookup_ramp_start(self) -> int:
        """RAMP_START, or the longest lookup draft whose verify costs at most LOOKUP_RAMP_LOSS plain steps
        more than a plain step where that is longer (V never falls as n grows, so the first length past
        the bound ends the search). Priced once per reply: on a flat curve the search takes 0.1 ms, and a
        chain asks for it several times a step."""
        if self._lookup_start is None:
            bound = (1 + LOOKUP_RAMP_LOSS) * self.verify(1)
            k = min(RAMP_START, self.max_k)
            while k < self.max_k and self.verify(k + 2) <= bound:
                k += 1
            self._lookup_start = k
        return self._lookup_start

    def _history(self, key: str) -> KeyHistory:
        return self.keys.setdefault(key, KeyHistory())

    def _rate(self, history: KeyHistory, acceptance: list[float], k: int, catch_up: int = 0) -> float:
        tokens, kept_so_far = 1.0, 1.0
        for rate in acceptance[:k]:
            kept_so_far *= rate
            tokens += kept_so_far
        drafting = k * (history.token_seconds or 0.0)
        if k and catch_up:  # a source that drafts must first take in what it skipped
            drafting += history.catch_up_fixed + history.catch_up_per_token * catch_up
        return tokens / (drafting * self.verify.level + self.verify(k + 1))

    def _rates(self, history: KeyHistory, acceptance: list[float], catch_up: int = 0) -> list[float]:
        """Expected tokens per second of each draft length, 0 (a plain step) included."""
        return [self._rate(history, acceptance, k, catch_up) for k in range(len(acceptance) + 1)]

    def _best_length(self, history: KeyHistory, acceptance: list[float]) -> int:
        return fastest(self._rates(history, acceptance))

    def _worth_probing(self, history: KeyHistory, limit: int, first_ask: bool) -> bool:
        """Re-check a key the estimates have ruled out, now and then, but only if drafting could pay
        at all (with every draft kept, at these costs). A lookup is re-checked after FIRST_PROBE_AFTER
        steps without drafts. A draft model is re-checked only where it is first asked in a reply: it
        holds the prompt then, while mid-reply it must first decode every token it skipped (measured
        on the Qwen 0.5B draft here: a sixth of what the target spent on them, so a re-check after 16
        plain steps cost some 4 target steps before drafting anything). Each re-check after which
        drafting still does not pay doubles the wait before the next (in steps; in replies up to
        MAX_REPLIES_BETWEEN_CHECKS), so their cost stays a small share of the time."""
        backoff = 2 ** min(history.failed_probes, 8)
        if history.is_draft_model:
            due = first_ask and history.idle_replies >= min(backoff, MAX_REPLIES_BETWEEN_CHECKS) - 1
        else:
            due = history.idle_steps >= FIRST_PROBE_AFTER * backoff
        if not due:
            return False
        certain = [1.0] * limit
        return self._best_length(history, certain) > 0
