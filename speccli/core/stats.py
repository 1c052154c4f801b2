"""What a generation reports: token, step and done events, and RunStats, the figures they add up to."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum


FORCED = "grammar"  # the source name of tokens a grammar forced (StepEvent.forced)


class Source(Enum):
    DRAFT = "draft"  # proposed by the draft, accepted by the target
    CORRECTION = "correction"  # the target's own token where it rejected a draft token
    BONUS = "bonus"  # the target's extra token after all K drafts were accepted
    TARGET = "target"  # target-only generation


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # the text this token completes; "" while a UTF-8 character is still partial
    source: Source


@dataclass(frozen=True)
class StepEvent:
    """One target decode: what was drafted (and by which source), what was kept, where the time went."""

    drafted: int
    accepted: int
    draft_seconds: float
    target_seconds: float
    other_seconds: float
    source: str | None = None  # the draft source ("model", "ngram"); None when nothing was drafted
    catch_up_seconds: float = 0.0  # of draft_seconds: a draft model taking in context it had not seen
    compute_seconds: float = 0.0  # of the step's time: inside llama.cpp's decode (both models)
    # Not in the three above: a draft model taking in the prompt at its first draft of the reply,
    # deferred from the prefill (`ModelDrafter.sync`), and counted as the prefill's time.
    prompt_seconds: float = 0.0
    # The last `tokens` of the draft came from `source` taking the first source's draft over.
    continuation: tuple[str, int] | None = None
    forced: int = 0  # the first `forced` drafted tokens were the grammar's (`source` drafted the rest)
    companion_rows: int = 0  # rows other slots' steps put in the same target decode (serve's --parallel)
    # Where the reply ended inside this step's kept drafts (an end of generation, a stop string): how
    # many of its tokens the reply used. None: the step was used whole. See `cut_to`.
    used: int | None = None

    def cut_to(self, used: int) -> StepEvent:
        """The step, its acceptance counted only as far as the reply used its `used` new tokens: drafts
        past them count as neither drafted nor kept in the acceptance figures, which so describe the
        text the caller got (kept drafts never outnumber the tokens used, the end-of-generation token
        included). The K chosen, its take-over and its costs still count whole, as does the policy."""
        return self if used > self.accepted else replace(self, used=used)

    def parts(self, *, as_counted: bool = True) -> list[SourcePart]:
        """Each source's share of the draft, in order: as the acceptance figures count it (up to
        `used`), or the whole draft (`as_counted=False`: what each source drafted, as its cost)."""
        drafted, accepted = self.drafted, self.accepted
        if as_counted and self.used is not None:
            drafted = accepted = self.used
        if self.forced:
            forced = [SourcePart(FORCED, min(drafted, self.forced), min(accepted, self.forced), judged=True)]
            rest = replace(self, drafted=self.drafted - self.forced, accepted=max(0, self.accepted - self.forced),
                           forced=0, used=None if self.used is None else max(0, self.used - self.forced))
            judged = accepted >= self.forced
            return forced + [replace(part, judged=part.judged and judged) for part in rest.parts(as_counted=as_counted)
                             if part.drafted]
        if self.source is None:
            return []
        if self.continuation is None:
            return [SourcePart(self.source, drafted, accepted, judged=True)]
        source, tokens = self.continuation
        first = self.drafted - tokens
        parts = [SourcePart(self.source, min(drafted, first), min(accepted, first), judged=True)]
        if drafted > first:
            parts.append(SourcePart(source, drafted - first, max(accepted - first, 0), judged=accepted >= first))
        return parts


@dataclass(frozen=True)
class SourcePart:
    source: str
    drafted: int
    accepted: int
    judged: bool  # False: a token before these was rejected, so the target never judged any of them


@dataclass(frozen=True)
class DoneEvent:
    reason: str  # "eog", "max_tokens", "stop", "context"
    stats: RunStats
    trailing_text: str = ""  # text held back (a possible stop string, a partial character) until the end


@dataclass
class PositionCounts:
    """Drafts judged by position: drafted_at[i] steps drafted token i+1, accepted_at[i] of them kept it.

    A draft token is only kept if every one before it was, so accepted_at[i] / drafted_at[i] is the
    share of steps drafting i+1 tokens that kept all i+1. The lists grow with the longest draft seen.
    """

    drafted: int = 0
    accepted: int = 0
    # Draft tokens the target actually judged: each step's accepted ones plus the one it rejected
    # (drafts after a rejection are never judged). Counted, not derived from the per-position lists:
    # with draft lengths that vary, a step that kept all of a short draft judged no further position.
    judged: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def add(self, drafted: int, accepted: int, reached: bool = True) -> None:
        """One step's draft: `drafted` tokens, the first `accepted` kept; `reached` False where the
        target judged none of them (another source's tokens before them were rejected)."""
        self.drafted += drafted
        self.accepted += accepted
        self.judged += (accepted + (accepted < drafted)) if reached else 0
        self._grow(drafted)
        for position in range(drafted):
            self.drafted_at[position] += 1
            self.accepted_at[position] += position < accepted

    def __add__(self, other: PositionCounts) -> PositionCounts:
        total = PositionCounts(self.drafted + other.drafted, self.accepted + other.accepted, self.judged + other.judged)
        for counts in (self, other):
            total._grow(len(counts.drafted_at))
            for position, (drafted, accepted) in enumerate(zip(counts.drafted_at, counts.accepted_at)):
                total.drafted_at[position] += drafted
                total.accepted_at[position] += accepted
        return total

    def _grow(self, length: int) -> None:
        missing = length - len(self.drafted_at)
        if missing > 0:
            self.drafted_at += [0] * missing
            self.accepted_at += [0] * missing

    @property
    def acceptance_rate(self) -> float:
        """Draft tokens kept / draft tokens proposed."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]


@dataclass
class RunStats:
    """Figures of one generation, or the sum of several (`+`). Times are per-step timer sums
    (perf_counter around each part of each step), never wall-clock time around a loop."""

    prompt_tokens: int = 0  # tokens of the prompt(s)
    prefill_seconds: float = 0.0  # making the caches hold the prompt
    draft_prompt_seconds: float = 0.0  # of prefill_seconds: a draft model taking in the prompt at its first draft
    generated: int = 0  # tokens emitted to the caller (end-of-generation tokens not counted)
    steps: int = 0  # target decodes in the decode phase
    draft_seconds: float = 0.0  # drafting: draft-model decodes and sampling, n-gram lookups
    catch_up_seconds: float = 0.0  # of draft_seconds: a draft model taking in tokens it skipped
    undrafted_seconds: float = 0.0  # of draft_seconds: steps that drafted nothing (asking the sources)
    target_seconds: float = 0.0  # target decodes (verification)
    other_seconds: float = 0.0  # the rest of each step: probabilities, verification rule, bookkeeping
    compute_seconds: float = 0.0  # of the three above: inside llama.cpp's decode; the rest is the host's
    positions: PositionCounts = field(default_factory=PositionCounts)  # all sources together
    by_source: dict[str, PositionCounts] = field(default_factory=dict)
    draft_lengths: dict[int, int] = field(default_factory=dict)  # steps by tokens drafted (the K chosen), 0 included
    take_overs: dict[str, int] = field(default_factory=dict)  # steps by the source that took a draft over

    def add(self, step: StepEvent) -> None:
        self.steps += 1
        self.prefill_seconds += step.prompt_seconds
        self.draft_prompt_seconds += step.prompt_seconds
        parts = step.parts()
        self.positions.add(sum(part.drafted for part in parts), sum(part.accepted for part in parts))
        for part in parts:
            self.by_source.setdefault(part.source, PositionCounts()).add(part.drafted, part.accepted, part.judged)
        self.draft_lengths[step.drafted] = self.draft_lengths.get(step.drafted, 0) + 1
        if step.continuation is not None:
            self.take_overs[step.continuation[0]] = self.take_overs.get(step.continuation[0], 0) + 1
        self.draft_seconds += step.draft_seconds
        self.catch_up_seconds += step.catch_up_seconds
        self.undrafted_seconds += 0.0 if step.drafted else step.draft_seconds
        self.target_seconds += step.target_seconds
        self.other_seconds += step.other_seconds
        self.compute_seconds += step.compute_seconds

    def __add__(self, other: RunStats) -> RunStats:
        lengths = dict(self.draft_lengths)
        for length, count in other.draft_lengths.items():
            lengths[length] = lengths.get(length, 0) + count
        sources = {name: self.by_source.get(name, PositionCounts()) + other.by_source.get(name, PositionCounts())
                   for name in {**self.by_source, **other.by_source}}
        take_overs = {name: self.take_overs.get(name, 0) + other.take_overs.get(name, 0)
                      for name in {**self.take_overs, **other.take_overs}}
        return RunStats(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            prefill_seconds=self.prefill_seconds + other.prefill_seconds,
            draft_prompt_seconds=self.draft_prompt_seconds + other.draft_prompt_seconds,
            generated=self.generated + other.generated,
            steps=self.steps + other.steps,
            draft_seconds=self.draft_seconds + other.draft_seconds,
            catch_up_seconds=self.catch_up_seconds + other.catch_up_seconds,
            undrafted_seconds=self.undrafted_seconds + other.undrafted_seconds,
            target_seconds=self.target_seconds + other.target_seconds,
            other_seconds=self.other_seconds + other.other_seconds,
            compute_seconds=self.compute_seconds + other.compute_seconds,
            positions=self.positions + other.positions,
            by_source=sources,
            draft_lengths=dict(sorted(lengths.items())),
            take_overs=take_overs,
        )

    @property
    def drafted_counted(self) -> int:
        """Draft tokens as the acceptance figures count them: up to where the reply ended (see
        `StepEvent.cut_to`). `drafted_whole` counts every one."""
        return self.positions.drafted

    @property
    def accepted(self) -> int:
        return self.positions.accepted

    @property
    def speculative(self) -> bool:
        """Whether any step drafted (a target-only run, or one where drafting never paid, did not)."""
        return self.positions.drafted > 0

    @property
    def decode_seconds(self) -> float:
        return self.draft_seconds + self.target_seconds + self.other_seconds

    @property
    def acceptance_rate(self) -> float:
        return self.positions.acceptance_rate

    @property
    def host_seconds(self) -> float:
        """The steps' time outside llama.cpp's decode: sampling, verifying, drafting's own work, bookkeeping."""
        return max(self.decode_seconds - self.compute_seconds, 0.0)

    @property
    def target_rows(self) -> int:
        """Rows of the target's logits the steps asked for: each step's drafts and one more."""
        return self.steps + self.drafted_whole

    @property
    def tokens_per_target_decode(self) -> float:
        """Mean tokens each target decode yields, counting its own correction/bonus token."""
        return self.generated / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode-phase speed: generated tokens over the summed step times (prefill excluded)."""
        return self.generated / self.decode_seconds if self.decode_seconds else 0.0

    def acceptance_by_position(self) -> list[float]:
        return self.positions.acceptance_by_position()

    @property
    def mean_draft_length(self) -> float:
        """Mean tokens drafted per step (the K chosen), steps that drafted nothing included."""
        return self.drafted_whole / self.steps if self.steps else 0.0

    @property
    def drafted_whole(self) -> int:
        """Every token drafted, those past where a reply ended included: the K chosen, what drafting
        cost. (`drafted_counted` counts what the acceptance figures count.)"""
        return sum(length * steps for length, steps in self.draft_lengths.items())


def drafting_record(stats: RunStats) -> dict:
    """The figures of drafting and verifying in `stats`, rounded for JSON: what chat's `--json` records and
    the server's `speculative` object both hold, defined once."""
    return {
        "drafted": stats.drafted_counted,
        "accepted": stats.accepted,
        "acceptance_rate": _rate(stats.positions),  # null where nothing was drafted: no rate, not 0%
        "acceptance_by_position": [round(rate, 4) for rate in stats.acceptance_by_position()],
        "target_decodes": stats.steps,
        "tokens_per_target_decode": round(stats.tokens_per_target_decode, 4),
        "draft_lengths": {str(length): count for length, count in sorted(stats.draft_lengths.items())},
        "by_source": {
            source: {"drafted": counts.drafted, "accepted": counts.accepted, "acceptance_rate": _rate(counts)}
            for source, counts in sorted(stats.by_source.items())
        },
        "take_overs": dict(sorted(stats.take_overs.items())),  # steps, by the source that took a draft over
        "prefill_seconds": round(stats.prefill_seconds, 6),
        "draft_seconds": round(stats.draft_seconds, 6),
        "catch_up_seconds": round(stats.catch_up_seconds, 6),  # of draft_seconds
        "target_seconds": round(stats.target_seconds, 6),
    }


Event = TokenEvent | StepEvent | DoneEvent


def _rate(counts: PositionCounts) -> float | None:
    return round(counts.acceptance_rate, 4) if counts.drafted else None
