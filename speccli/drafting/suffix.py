"""Drafts from earlier replies as well as the context: the lookup (ngram.py), and the same lookup in a
store of what the target said before, its continuation walked as in a suffix tree (SuffixDecoding;
docs/drafting.md, *Earlier replies*). The store holds only tokens the target kept, after they were
kept, so a draft depends on the past alone; where it lives (a chat, a serve process, a file with
`--remember`: speccli/remembered/stores.py) is the caller's.
"""
from __future__ import annotations

from array import array
from collections import Counter
from typing import Sequence

import numpy as np

from speccli.drafting.ngram import JUDGED_TOKENS, MAX_MATCH, Match, NgramLookup, longest_matches

SEPARATOR = -1  # between replies in the store: no token matches it, so no match spans two replies
HEAD_TOKENS = 16  # prompt tokens kept before each reply
MIN_SHARE = 0.1  # a walk stops where fewer than this share of the matching occurrences went on its way
# A lookup's cost is bounded: a match starts from the most recent MAX_CANDIDATES occurrences of the last
# token, and its continuation is counted over the most recent WALKED of those that match longest.
MAX_CANDIDATES = 256
WALKED = 16
DEFAULT_CAP_TOKENS = 64 * 2**20 // 8  # 64 MiB: 4 bytes a token for the text and 4 for its index


class SuffixStore:
    """Earlier replies of one target vocabulary, oldest first, at most `cap_tokens` of them."""

    def __init__(self, cap_tokens: int = DEFAULT_CAP_TOKENS) -> None:
        self.cap_tokens = cap_tokens
        self.clear()

    def clear(self) -> None:
        self._tokens = array("i")
        self._positions: dict[int, array] = {}
        self._starts: list[int] = []  # where each reply's entry (its separator) starts

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    def begin(self, head: Sequence[int]) -> None:
        """A new reply, after these prompt tokens."""
        self._starts.append(len(self._tokens))
        self._tokens.append(SEPARATOR)
        self.extend(head)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self._positions.setdefault(token, array("i")).append(len(self._tokens))
            self._tokens.append(token)
        if len(self._tokens) > self.cap_tokens:
            self._evict()

    def match(self, context: Sequence[int], limit: int) -> Match | None:
        """The longest match of the context's end among the replies, and up to `limit` tokens of what
        followed it: the token most matching occurrences went on with (of equals the most recent), then
        the same among those, while the share that went that way, multiplied along the walk, stays at
        least MIN_SHARE; None where nothing followed."""
        if context[-1] not in self._positions:
            return None
        tokens = np.frombuffer(self._tokens, dtype=np.int32)
        # The most recent occurrences of the last token that something followed.
        candidates = np.frombuffer(self._positions[context[-1]], dtype=np.int32)[-MAX_CANDIDATES:]
        candidates = candidates[candidates + 1 < len(tokens)]
        candidates = candidates[tokens[candidates + 1] != SEPARATOR]
        if not len(candidates):
            return None
        backwards = np.asarray(context[-MAX_MATCH:][::-1], dtype=np.int32)
        candidates, length = longest_matches(tokens, candidates, backwards, one_position_above=MAX_CANDIDATES)
        candidates = candidates[-WALKED:]
        occurrences = len(candidates)
        # What followed each occurrence, up to the limit (a reply's end reads as SEPARATOR), newest first.
        ahead = candidates[::-1, None] + np.arange(1, limit + 1)
        window = np.where(ahead < len(tokens), tokens[np.minimum(ahead, len(tokens) - 1)], SEPARATOR)
        following: list[int] = []
        share = 1.0
        while len(following) < limit:
            # As far as they all went on alike, that is the proposal, and the share stays.
            rest = window[:, len(following):]
            alike = (rest == rest[0]).all(axis=0) & (rest[0] != SEPARATOR)
            run = len(alike) if alike.all() else int(alike.argmin())
            following += rest[0, :run].tolist()
            if len(following) == limit:
                break
            # Where they part: the token most went on with, of equals the most recent.
            counts = Counter(rest[:, run].tolist())
            best = max(counts, key=lambda token: (token != SEPARATOR, counts[token]))  # max keeps the first: newest
            share *= counts[best] / len(window)
            if best == SEPARATOR or share < MIN_SHARE:
                break
            following.append(best)
            window = window[window[:, len(following) - 1] == best]
        if not following:
            return None
        went_on = "once" if occurrences == 1 else "same" if len(window) == occurrences else "varied"
        return Match(SuffixLookup.name, length, went_on, following)

    def _evict(self) -> None:
        """Drop the oldest replies, down to three quarters of the cap (so eviction is rare), and re-index."""
        keep_from = next((start for start in self._starts if len(self._tokens) - start <= self.cap_tokens * 3 // 4), len(self._tokens))
        kept = np.frombuffer(self._tokens, dtype=np.int32)[keep_from:].copy()
        self._load_tokens(kept)

    def _load_tokens(self, tokens: np.ndarray) -> None:
        self._tokens = array("i", tokens.astype(np.int32).tobytes())
        self._starts = np.flatnonzero(tokens == SEPARATOR).tolist()
        order = np.argsort(tokens, kind="stable")
        ordered = tokens[order]
        bounds = np.flatnonzero(np.diff(ordered)) + 1
        self._positions = {
            int(token): array("i", group.astype(np.int32).tobytes())
            for token, group in zip(ordered[np.r_[0, bounds]] if len(ordered) else [], np.split(order, bounds))
            if token != SEPARATOR
        }

    def persist(self, now: bool = False) -> None:
        """Kept in this process's memory only (`speccli.remembered.stores` keeps one in a file)."""

    def close(self) -> None:
        pass


class SuffixLookup(NgramLookup):
    """The context's lookup and the store's: the longer match of the two."""

    name = "suffix"

    def __init__(self, store: SuffixStore | None = None) -> None:
        super().__init__()
        self.store = SuffixStore() if store is None else store
        self._head: list[int] = []  # the prompt's last tokens, until the reply's first kept token begins an entry
        self._in_reply = False

    def sync(self, context: Sequence[int]) -> None:
        super().sync(context)
        self._head, self._in_reply = list(context[-HEAD_TOKENS:]), False

    def match(self, context: Sequence[int], limit: int) -> Match | None:
        here = super().match(context, limit)
        earlier = self.store.match(context, min(limit, JUDGED_TOKENS))
        if earlier is not None and (here is None or self.store_drafts(here, earlier)):
            return earlier
        return here

    @staticmethod
    def store_drafts(here: Match, earlier: Match) -> bool:
        """The store's match drafts where longer (a tie is this text's own; tests/benchmarks/suffix_replay.py)."""
        return earlier.length > here.length

    def kept(self, tokens: Sequence[int]) -> None:
        if not self._in_reply:
            self.store.begin(self._head)
            self._in_reply = True
        self.store.extend(tokens)

    def forget_all(self) -> None:
        self.new_conversation()
        self.store.clear()
