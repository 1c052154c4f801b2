"""What drafting and verifying cost on this machine: the target's V(n) and each key's drafting cost.

Timings on a shared machine are noisy one way only (load makes a decode slower, never faster), so one
step's timing moves an estimate by a bounded step (clipped at twice the estimate), and V's curve is the
largest non-decreasing one under its points: a spike at one size is pulled down by the sizes above it.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from speccli.drafting.acceptance import RECENCY

TIMING_WEIGHT = 1 - RECENCY  # how much one step's timing moves a cost estimate: the estimates' one memory


class VerifyCosts:
    """V(n): seconds of one target decode with n logit rows, plus the per-row work after it.

    Load slows every size alike, but steps measure mostly the sizes chosen most: refreshed size by size,
    today's one-row cost would be compared with the profile's four-row cost (Qwen n-gram drafts on
    prose, 0.91x). So each timing moves a level that scales the whole curve, and what the level does not
    explain refines the shape at that size (the smallest size anchors it)."""

    def __init__(self, decode_seconds: dict[int, float] | None = None) -> None:
        self.level = 1.0  # how much slower than the shape every decode runs now
        # Rows of other slots (serve's --parallel) in the last step's decode, expected in the next:
        # a slot pays its rows' share of the batch's decode (RESULTS.md, *Slots*).
        self.companions = 0
        self.per_row_seconds = 0.0
        self.decode_seconds: dict[int, float] = {}  # the curve's shape at level 1, by rows
        self._sizes: list[int] = []
        self._envelope: list[float] = []
        self._shapes: list[float] = []  # _shape(n) at index n, up to the widest size profiled
        self.add_points(decode_seconds or {})

    def add_points(self, decode_seconds: dict[int, float]) -> None:
        """Set the shape at these sizes (a profile), and recompute the non-decreasing envelope once."""
        self.decode_seconds.update(decode_seconds)
        self._sizes = sorted(self.decode_seconds)
        values = [self.decode_seconds[size] for size in self._sizes]
        for i in range(len(values) - 2, -1, -1):
            values[i] = min(values[i], values[i + 1])
        self._envelope = values
        self._shapes = [0.0] + [self._shape(n) for n in range(1, self._sizes[-1] + 1)] if values else []

    def __call__(self, n: int) -> float:
        return self.decode(n) + self.per_row_seconds * n

    def decode(self, n: int) -> float:
        """The decode part of V(n): beside other slots' rows, n rows' share of the whole decode."""
        total = n + self.companions
        return self.level * (self._shapes[total] if total < len(self._shapes) else self._shape(total)) * n / total

    def curve(self, rows: int) -> list[float]:
        """[V(1), .., V(rows)]: `auto` reads it for every length at every step, so the shapes are kept."""
        level, per_row, shapes = self.level, self.per_row_seconds, self._shapes
        if rows + self.companions >= len(shapes) or self.companions:
            return [self(n) for n in range(1, rows + 1)]
        return [level * shapes[n] + per_row * n for n in range(1, rows + 1)]

    def _shape(self, n: int) -> float:
        sizes, values = self._sizes, self._envelope
        if len(sizes) == 1:  # a context too full to profile more: assume cost grows with rows
            return values[0] * n / sizes[0]
        at = bisect.bisect_left(sizes, n)
        if at < len(sizes) and sizes[at] == n:
            return values[at]
        # Interpolate between the neighbours, or extend the nearest segment's slope.
        if 0 < at < len(sizes):
            low, high = at - 1, at
        else:
            low, high = (len(sizes) - 2, len(sizes) - 1) if at else (0, 1)
        slope = (values[high] - values[low]) / (sizes[high] - sizes[low])
        return max(values[low] + slope * (n - sizes[low]), values[0])

    def update(self, n: int, decode_seconds: float, other_seconds: float, companions: int = 0) -> None:
        """One step's timing: a decode of n rows (and `companions` of other slots), the per-row work after."""
        own, n = n, n + companions
        self.companions = 0
        if not self.decode_seconds:  # nothing profiled (a context too full): this is the curve
            self.add_points({n: decode_seconds / self.level})
        else:
            expected = self.decode(n)
            observed = min(decode_seconds, 2 * expected)
            self.level *= 1 + TIMING_WEIGHT * (observed / expected - 1)
            if n > self._sizes[0]:  # the smallest size anchors the shape: its timings are the level's
                shape = self.decode_seconds.get(n, self._shape(n))
                self.add_points({n: shape + TIMING_WEIGHT * (observed / self.level - shape)})
        self.companions = companions
        self.per_row_seconds += TIMING_WEIGHT * (other_seconds / own - self.per_row_seconds)


@dataclass
class DraftCost:
    """Seconds one key's drafts cost, at the verify curve's level 1 (load slows both alike)."""

    token_seconds: float | None = None  # one drafted token; None until measured
    # Taking in m skipped tokens first (a draft model's catch-up): catch_up_fixed + catch_up_per_token * m.
    catch_up_fixed: float = 0.0
    catch_up_per_token: float = 0.0

    def taking_in(self, catch_up: int) -> float:
        """Seconds (at level 1) to take in `catch_up` skipped tokens before drafting."""
        return self.catch_up_fixed + self.catch_up_per_token * catch_up if catch_up else 0.0

    def calibrate(self, token_seconds: float, catch_up_seconds: dict[int, float], level: float) -> None:
        """The measured cost of a token, and the line through the smallest and largest catch-ups timed
        (or from 0 through one)."""
        self.token_seconds = token_seconds / level
        points = sorted(catch_up_seconds.items())
        if points:
            (low, low_seconds), (high, high_seconds) = points[0] if len(points) > 1 else (0, 0.0), points[-1]
            per_token = max(0.0, (high_seconds - low_seconds) / (high - low))
            self.catch_up_per_token = per_token / level
            self.catch_up_fixed = max(0.0, low_seconds - per_token * low) / level

    def learn_token(self, seconds_per_token: float) -> None:
        """A step's drafted tokens took this long each (at level 1)."""
        known = self.token_seconds
        self.token_seconds = seconds_per_token if known is None else known + TIMING_WEIGHT * (seconds_per_token - known)

    def learn_catch_up(self, tokens: int, seconds: float, level: float) -> None:
        """A catch-up of `tokens` took `seconds`: scale the line towards it, bounded as a verify is."""
        expected = (self.catch_up_fixed + self.catch_up_per_token * tokens) * level
        if expected > 0:
            scale = 1 + TIMING_WEIGHT * (min(seconds, 2 * expected) / expected - 1)
            self.catch_up_fixed *= scale
            self.catch_up_per_token *= scale
