"""Per key, per draft position: how often a draft token is kept, recent drafts weighing most.

a_j is the acceptance of draft position j given that 1..j-1 were kept, shrunk towards the position
before it while few have been seen; a position never judged takes the key's continuation rate (what
positions past the first have kept, pooled: the geometric model behind speculative decoding's
analysis), so a draft that is always kept grows past any depth it has tried. The evidence for each
constant: docs/results.md and tests/benchmarks/RESULTS.md, "K per step".
"""
from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_ACCEPTANCE = 0.9  # optimistic, so that a new source is tried before its costs rule it out
PRIOR_WEIGHT = 1.55  # in judged drafts
# Each new judged draft of a key weighs the earlier ones by this (a memory of ~10 drafts): acceptance
# moves with the text (code, then prose; a chat's next question), and the estimates must follow it.
RECENCY = 0.9
# The same memory counted in replies: the replies whose lengths spread a draft model's prompt intake
# (`AutoK._intake_per_token`), and the most replies between re-checks of a draft model ruled out.
# Replayed, 2 to 32 replies alike for the first and 8 to unbounded for the second (RESULTS.md).
MEMORY = round(1 / (1 - RECENCY))
# Even odds, twice. A draft model's token is unsure where its top probability is below UNSURE (as
# llama.cpp's p_min marks one, at 0.75 by default: 0.5 to 0.9 replay alike, RESULTS.md). A quantized
# copy of the target agrees with it even there (Gemma: 0.99 kept), a smaller model often does not: a
# key stops at unsure tokens only while their measured rate (from PRIOR_ACCEPTANCE, as every estimate
# here) is below UNSURE, kept less often than not, and tokens kept at that rate would not pay at the
# measured costs (on a GPU they do; RESULTS.md, "The redesigned policy").
UNSURE = 0.5


def shrunk(kept: float, judged: float, prior: float) -> float:
    """kept / judged, pulled towards `prior` as if PRIOR_WEIGHT more drafts had been judged at that rate."""
    return (kept + PRIOR_WEIGHT * prior) / (judged + PRIOR_WEIGHT)


@dataclass
class Acceptance:
    """Per position j: drafts that judged position j+1 (drafted it, kept 1..j), and drafts that kept
    it; and the unsure tokens judged and kept. All weighted by recency."""

    judged_at: list[float] = field(default_factory=list)
    kept_at: list[float] = field(default_factory=list)
    unsure_judged: float = 0.0
    unsure_kept: float = 0.0
    recency: float = RECENCY  # what each judged draft weighs the earlier ones by

    def add(self, drafted: int, accepted: int, confidences: tuple[float, ...] = ()) -> None:
        """One draft: `drafted` tokens (a withheld one included), the first `accepted` kept;
        `confidences` of its tokens where the source gave them."""
        judged = min(drafted, accepted + 1)
        self.fade(self.recency)
        while len(self.judged_at) < judged:
            self.judged_at.append(0.0)
            self.kept_at.append(0.0)
        for position in range(judged):
            self.judged_at[position] += 1
            self.kept_at[position] += position < accepted
        for position, confidence in enumerate(confidences[:judged]):  # a withheld token has none
            if confidence < UNSURE:
                self.unsure_judged += 1
                self.unsure_kept += position < accepted

    def fade(self, weight: float) -> None:
        """Weigh everything counted so far by `weight`: what comes next counts for more."""
        self.judged_at = [weight * count for count in self.judged_at]
        self.kept_at = [weight * count for count in self.kept_at]
        self.unsure_judged *= weight
        self.unsure_kept *= weight

    def unsure_rate(self) -> float:
        return shrunk(self.unsure_kept, self.unsure_judged, PRIOR_ACCEPTANCE)

    def rates(self, positions: int) -> list[float]:
        """a_1 .. a_positions: each judged position's rate, shrunk towards the one before it (the first
        towards the key's pooled rate); a position never judged gets the continuation rate. A draft that
        is mostly all-or-nothing (a lookup is either the text being copied or not) then keeps a low
        first rate but a high continuation rate, as it should."""
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
