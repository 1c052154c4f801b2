"""Per key, per draft position: how often a draft token is kept, recent drafts weighing most.

a_j is the acceptance of draft position j given that 1..j-1 were kept, shrunk towards the position
before it while few have been seen; a position never judged takes the key's continuation rate (positions
past the first, pooled: speculative decoding's geometric model), so a draft always kept grows past any
depth it has tried. The evidence for each constant: tests/benchmarks/RESULTS.md, "K per step".
"""
from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_ACCEPTANCE = 0.9  # optimistic, so that a new source is tried before its costs rule it out
PRIOR_WEIGHT = 1.55  # in judged drafts
# Each new judged draft of a key weighs the earlier ones by this (a memory of ~10 drafts): acceptance
# moves with the text (code, then prose; a chat's next question).
RECENCY = 0.9
# The same memory in replies: those whose lengths spread a draft model's prompt intake, and the most
# between re-checks of a draft model ruled out (2 to 32 and 8 to unbounded replay alike: RESULTS.md).
MEMORY = round(1 / (1 - RECENCY))


def shrunk(kept: float, judged: float, prior: float) -> float:
    """kept / judged, pulled towards `prior` as if PRIOR_WEIGHT more drafts had been judged at that rate."""
    return (kept + PRIOR_WEIGHT * prior) / (judged + PRIOR_WEIGHT)


@dataclass
class Acceptance:
    """Per position j: drafts that judged position j+1 (drafted it, kept 1..j), and drafts that kept
    it, weighted by recency."""

    judged_at: list[float] = field(default_factory=list)
    kept_at: list[float] = field(default_factory=list)
    recency: float = RECENCY  # what each judged draft weighs the earlier ones by

    def add(self, drafted: int, accepted: int) -> None:
        """One draft: `drafted` tokens, the first `accepted` kept."""
        judged = min(drafted, accepted + 1)
        self.fade(self.recency)
        while len(self.judged_at) < judged:
            self.judged_at.append(0.0)
            self.kept_at.append(0.0)
        for position in range(judged):
            self.judged_at[position] += 1
            self.kept_at[position] += position < accepted

    def fade(self, weight: float) -> None:
        """Weigh everything counted so far by `weight`: what comes next counts for more."""
        self.judged_at = [weight * count for count in self.judged_at]
        self.kept_at = [weight * count for count in self.kept_at]

    def rates(self, positions: int) -> list[float]:
        """a_1 .. a_positions: each judged position's rate, shrunk towards the one before it (the first
        towards the pooled rate); one never judged gets the continuation rate. An all-or-nothing draft (a
        lookup copies the text or not) keeps a low first rate and a high continuation rate, as it should."""
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
