"""Draft-free drafting by lookup: propose what followed the longest earlier match of the context's end.

The index keeps, for every token id, the positions where it occurs. A lookup narrows the earlier
occurrences of the last token, in numpy, to those that match the context's end longest; the most recent
is the match (docs/drafting.md, *The lookup*). Its key tells the K policy its length and how the matched
text went on before (once, each time as now, or variously): their first tokens are kept at very
different rates.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speccli.validation import MAX_K

MATCH_LENGTHS = ((12, "12+"), (6, "6-11"), (3, "3-5"), (1, "1-2"))  # a key's match length, from the shortest of each
MAX_MATCH = 64  # a match is followed back at most this far: longer ones all get the longest key
NARROWING_STEP = 8  # positions compared per numpy pass once the candidates are few
MANY_CANDIDATES = 64  # more than this: narrowed one position per pass
JUDGED_TOKENS = 25  # of a proposal not drafted, judged against what the step yields: as many as auto's longest (24) yields


@dataclass(frozen=True)
class Match:
    """A lookup's find: which lookup, the match's length, how the matched text went on before ("once",
    "same", "varied": `NgramLookup._match`), and what followed it."""

    source: str
    length: int
    went_on: str
    following: list[int]  # as many tokens as a step may draft

    @property
    def key(self) -> str:
        """The kind of match the K policy learns apart, e.g. "ngram:12+/same"."""
        return f"{self.source}:{next(name for shortest, name in MATCH_LENGTHS if self.length >= shortest)}/{self.went_on}"


def longest_matches(
    tokens: np.ndarray, candidates: np.ndarray, backwards: np.ndarray, one_position_above: int = MANY_CANDIDATES,
) -> tuple[np.ndarray, int]:
    """Of `candidates`, positions in `tokens` holding backwards[0], those whose text up to them matches
    `backwards` (a text's end, backwards[m] the token m places before its last) longest, and that length."""
    length = 1  # every candidate matches the last token
    # A frequent token has thousands of earlier positions, most of which one comparison rules out:
    # while they are many, compare one position back per pass...
    while len(candidates) > one_position_above and length < len(backwards):
        kept = candidates[(candidates >= length) & (tokens[candidates - length] == backwards[length])]
        if not len(kept):
            return candidates, length
        candidates, length = kept, length + 1
    # ...then several per pass, keeping those that match longest.
    while length < len(backwards):
        offsets = np.arange(length, min(length + NARROWING_STEP, len(backwards)))
        compared = candidates[:, None] - offsets  # (candidate, offset) -> position compared
        same = (compared >= 0) & (tokens[np.maximum(compared, 0)] == backwards[offsets])
        extra = np.where(same.all(axis=1), len(offsets), same.argmin(axis=1))  # matched before the first miss
        longest = int(extra.max())
        candidates = candidates[extra == longest]
        length += longest
        if longest < len(offsets):
            break
    return candidates, length


class NgramLookup:
    """The lookup in the context. Passive: the planner asks it for a match and tells it where the context
    was cut back."""

    name = "ngram"

    def __init__(self) -> None:
        self.new_conversation()

    def new_conversation(self) -> None:
        self._tokens = array("i")  # the indexed prefix of the context
        self._positions: dict[int, array] = {}  # token id -> ascending positions of it in _tokens

    def forget_all(self) -> None:
        self.new_conversation()

    def sync(self, context: Sequence[int]) -> None:
        self._index(context)

    def kept(self, tokens: Sequence[int]) -> None:
        """The index takes kept tokens in as the context grows."""

    def match(self, context: Sequence[int], limit: int) -> Match | None:
        """The longest earlier match of the context's end, and up to `limit` tokens of what followed it."""
        self._index(context)
        match = self._longest_match()
        if match is None:
            return None
        end, length, went_on = match
        period = len(context) - end  # what followed the match runs up to the context's end
        # A match at least that long covers a whole period: the text before the end repeated itself, so
        # the proposal repeats it on past the end (a loop, "la la la", would otherwise draft one period).
        available = min(limit, MAX_K) if length >= period else min(period, limit, MAX_K)
        return Match(NgramLookup.name, length, went_on, [context[end + i % period] for i in range(available)])

    def forget(self, n_tokens: int) -> None:
        # Positions were appended in order, so each dropped position is the last of its token's array.
        for position in range(len(self._tokens) - 1, n_tokens - 1, -1):
            token = self._tokens[position]
            positions = self._positions[token]
            positions.pop()
            if not positions:
                del self._positions[token]
        del self._tokens[n_tokens:]

    def _index(self, context: Sequence[int]) -> None:
        """Add the tokens of `context` past the indexed prefix (which `context` extends)."""
        for position in range(len(self._tokens), len(context)):
            token = context[position]
            self._tokens.append(token)
            positions = self._positions.get(token)
            if positions is None:
                positions = self._positions[token] = array("i")
            positions.append(position)

    def _longest_match(self) -> tuple[int, int, str] | None:
        """(end of the earlier occurrence, match length, how it went on: `_match`) for the longest suffix
        of the indexed context that occurred earlier with a continuation, the most recent; None if none.
        The numpy views live only in this call: an array cannot grow while viewed."""
        tokens = np.frombuffer(self._tokens, dtype=np.int32)
        # Earlier positions of the last token; the last one is that token itself, which has no continuation.
        candidates = np.frombuffer(self._positions[int(tokens[-1])], dtype=np.int32)[:-1]
        if not len(candidates):
            return None
        return self._match(tokens, *longest_matches(tokens, candidates, tokens[::-1][:MAX_MATCH]))

    @staticmethod
    def _match(tokens: np.ndarray, candidates: np.ndarray, length: int) -> tuple[int, int, str]:
        """The most recent of `candidates` (the earlier occurrences that match `length` tokens), and how
        the text went on after them: "once" (one occurrence), "same" (each time with the token proposed
        now) or "varied"."""
        end = int(candidates.max()) + 1
        if len(candidates) == 1:
            return end, length, "once"
        return end, length, "same" if bool((tokens[candidates + 1] == tokens[end]).all()) else "varied"
