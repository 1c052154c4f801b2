"""Sequences compared (token ids, token texts, merge rules)."""
from __future__ import annotations

from typing import Sequence


def common_prefix_length(a: Sequence[object], b: Sequence[object]) -> int:
    """How many leading items `a` and `b` share: where they part, or where the shorter ends."""
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length
