"""The rule that turns a candidate's figures into OK, DEGRADED or BROKEN.

Grounded in Gemma 3 270M against its F32 reference (built-in text, 543 positions, temperature 1):
Q8_0 0.976 expected acceptance, Q4_K_M 0.968, Q2_K 0.661, and the Q8_0 file with two layers' weights
zeroed 0.020. Working quants sit far above OK_ACCEPTANCE; a file that is broken (wrong weights,
a backend bug) far below BROKEN_ACCEPTANCE, where its drafts would be mostly rejected.
"""
from __future__ import annotations

from enum import Enum

from speccli.util.format import counted

OK_ACCEPTANCE = 0.90
BROKEN_ACCEPTANCE = 0.40
MIN_BUCKET_POSITIONS = 16  # a stretch of the sequences counts for the length rule only with this many positions
# Below this many positions the verdict is given but said to rest on too little text: one position's
# acceptance ranges over [0, 1], so a handful can put a DEGRADED quant above OK_ACCEPTANCE.
FEW_POSITIONS = 64

RULE = (
    f"OK: expected acceptance Σmin(p,q) >= {OK_ACCEPTANCE:.2f}. "
    f"BROKEN: expected acceptance < {BROKEN_ACCEPTANCE:.2f}, overall or in any stretch of positions "
    f"(by offset in the sequence, >= {MIN_BUCKET_POSITIONS} positions), since a break often shows only past "
    "some length. DEGRADED: in between. Measured on Gemma 3 270M vs F32: Q8_0 0.976, Q4_K_M 0.968, "
    "Q2_K 0.661, two layers zeroed 0.020."
)


class Fidelity(str, Enum):
    OK = "OK"
    DEGRADED = "DEGRADED"
    BROKEN = "BROKEN"


def judge(acceptance: float, stretches: list[tuple[str, int, float]], broken: int, positions: int) -> tuple[Fidelity, str]:
    """The verdict and its reason, from the mean acceptance, (label, positions, acceptance) per stretch,
    and the positions where the logits held a NaN or +inf, of how many."""
    verdict, reason = _verdict(acceptance, stretches, broken, positions)
    if positions < FEW_POSITIONS and not broken:
        reason += f" (from only {counted(positions, 'position')}, too few to rely on: give a longer --text or more --prompts)"
    return verdict, reason


def _verdict(acceptance: float, stretches: list[tuple[str, int, float]], broken: int, positions: int) -> tuple[Fidelity, str]:
    if broken:
        return Fidelity.BROKEN, f"logits not finite (NaN or infinity) at {broken} of {positions} positions"
    if acceptance < BROKEN_ACCEPTANCE:
        return Fidelity.BROKEN, f"expected acceptance {acceptance:.3f} < {BROKEN_ACCEPTANCE:.2f}"
    for label, positions, stretch_acceptance in stretches:
        if positions >= MIN_BUCKET_POSITIONS and stretch_acceptance < BROKEN_ACCEPTANCE:
            return Fidelity.BROKEN, (
                f"expected acceptance {stretch_acceptance:.3f} < {BROKEN_ACCEPTANCE:.2f} at positions {label}"
            )
    if acceptance >= OK_ACCEPTANCE:
        return Fidelity.OK, f"expected acceptance {acceptance:.3f} >= {OK_ACCEPTANCE:.2f}"
    return Fidelity.DEGRADED, f"expected acceptance {acceptance:.3f} in [{BROKEN_ACCEPTANCE:.2f}, {OK_ACCEPTANCE:.2f})"
