"""The greedy honesty check: at temperature 0 every speculative text must equal the target-only text of
its round; a parting is allowed only at a near-tie of the target's top two logits."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from speccli.bench.report import GreedyCheck, Parting
from speccli.core.parting import find_parting
from speccli.errors import SpeccliError
from speccli.llama.model import Model


class GreedyCheckFailed(SpeccliError):
    """Greedy speculative output parted from the target's own output where no near-tie explains it."""

    exit_code = 3


@dataclass
class GreedyChecker:
    """Compares the outputs of each round as it finishes (the target is free then)."""

    applies: bool
    checked: int = 0
    identical: int = 0
    partings: list[Parting] = field(default_factory=list)

    def check_round(
        self,
        target: Model,
        prompt_tokens: Sequence[int],
        labels: dict,
        reference: list[int],
        speculative: dict[int, tuple[list[int], str]],
        reference_reason: str,
    ) -> None:
        """`labels`: task, prompt_index, run; `speculative`: K -> (tokens, stop reason)."""
        for k, (candidate, reason) in speculative.items():
            self.checked += 1
            if candidate == reference:
                self.identical += 1
                continue
            parting = find_parting(target, prompt_tokens, reference, candidate, k)
            if parting is not None:
                self.partings.append(Parting(
                    **labels,
                    k=k,
                    index=parting.index,
                    target_token=parting.reference_token,
                    speculative_token=parting.candidate_token,
                    top_two_gap=parting.top_two_gap,
                    tolerance=parting.tolerance,
                    near_tie=bool(parting.near_tie),
                    description=parting.describe(),
                ))
                continue
            # Equal as far as both go, yet one is longer: with the end-of-generation token kept and the
            # same token limit on both sides, nothing explains that, so it fails like any other parting.
            shorter = min(len(reference), len(candidate))
            self.partings.append(Parting(
                **labels,
                k=k,
                index=shorter,
                target_token=None,
                speculative_token=None,
                top_two_gap=None,
                tolerance=None,
                near_tie=False,
                description=(
                    f"outputs agree for {shorter} tokens, then one side stops ({reference_reason} alone vs "
                    f"{reason} speculative) where the other goes on: not a near-tie"
                ),
            ))

    def result(self) -> GreedyCheck:
        if not self.applies:
            status = "not_applicable"
        elif any(not p.near_tie for p in self.partings):
            status = "failed"
        else:
            status = "near_tie" if self.partings else "passed"
        return GreedyCheck(
            applies=self.applies, status=status, checked=self.checked, identical=self.identical, partings=self.partings
        )


def raise_if_failed(check: GreedyCheck) -> None:
    if check.status == "failed":
        raise GreedyCheckFailed(
            f"greedy check failed: {len(check.unexplained)} speculative output(s) parted from the target's own "
            "where no near-tie explains it"
        )
