"""Token sequences compared."""
from __future__ import annotations

from typing import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length
