"""Draft-free drafting by lookup: propose what followed the longest earlier match of the context's end.

Text that repeats its input (rewriting code given in the prompt, quoting, filling a repetitive
structure) is predicted exactly by its own history. The index maps every n-gram of the context
(n = 1 .. MAX_INDEXED) to the end of its most recent occurrence that has a continuation, and grows
incrementally: each new token adds MAX_INDEXED entries, so a lookup costs the same at 16k tokens as
at 100. The match is then extended backwards token by token, and its length picks the policy key:
a 12-token match predicts far better than a 1-token one, and the K policy learns each kind apart.
"""
from __future__ import annotations

from typing import Sequence

from speccli.drafting.base import Draft, DraftRequest

MAX_INDEXED = 8  # n-gram lengths indexed; longer matches are found by extending an 8-token one
MATCH_LENGTH_KEYS = ((12, "ngram:12+"), (6, "ngram:6-11"), (3, "ngram:3-5"), (1, "ngram:1-2"))
MAX_EXTENSION = 64  # how far back a match is extended when choosing its key


class NgramDrafter:
    name = "ngram"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._tokens: list[int] = []  # the indexed prefix of the context
        # _ends[n - 1][gram] = e: tokens[e - n : e] == gram, the latest such e with e < len(tokens).
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(MAX_INDEXED)]

    def sync(self, context: Sequence[int]) -> None:
        self._index(context)

    def propose(self, request: DraftRequest) -> Draft:
        context = request.context
        self._index(context)
        match = self._longest_match(context)
        if match is None:
            return Draft.nothing()
        end, length = match
        key = next(name for shortest, name in MATCH_LENGTH_KEYS if length >= shortest)
        available = min(len(context) - end, request.limit)
        k = request.length_for(key, available)
        if k <= 0:
            return Draft.nothing()
        return Draft(self.name, key, list(context[end : end + k]), None)

    def forget(self, n_tokens: int) -> None:
        if n_tokens < len(self._tokens):
            kept = self._tokens[:n_tokens]
            self.reset()
            self._index(kept)

    def token_costs(self, context: Sequence[int]) -> dict[str, float]:
        return {}  # a lookup costs microseconds: nothing the policy needs to weigh

    def _index(self, context: Sequence[int]) -> None:
        """Add the tokens of `context` past the indexed prefix (which `context` extends)."""
        tokens = self._tokens
        for position in range(len(tokens), len(context)):
            tokens.append(context[position])
            # The n-grams ending just before `position` now have a continuation: tokens[position].
            for n in range(1, min(MAX_INDEXED, position) + 1):
                self._ends[n - 1][tuple(tokens[position - n : position])] = position

    def _longest_match(self, context: Sequence[int]) -> tuple[int, int] | None:
        """(end of the earlier occurrence, match length) for the longest indexed suffix of the context."""
        for n in range(min(MAX_INDEXED, len(context) - 1), 0, -1):
            end = self._ends[n - 1].get(tuple(context[len(context) - n :]))
            if end is not None:
                length = n
                while length < MAX_EXTENSION and end - length > 0 and context[end - length - 1] == context[-length - 1]:
                    length += 1
                return end, length
        return None
