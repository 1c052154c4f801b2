"""The greedy honesty check: at temperature 0 every speculative text must equal the target-only text of
its round; a parting is allowed only at a near-tie of the target's top two logits. The tolerance is
measured at the widest verify batch the speculative run used (its largest K chosen, plus one row):
with `auto` that varies, and a wider batch can differ more from single-token decodes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from speccli.bench.report import GreedyCheck, Measurement, Parting
from speccli.core.parting import find_parting
from speccli.errors import SpeccliError
from speccli.llama.model import Model


class GreedyCheckFailed(SpeccliError):
    """Greedy speculative output parted from the target's own output where no near-tie explains it."""

    exit_code = 3


@dataclass
class GreedyChecker:
    """Counts and explains partings, one speculative generation at a time, as each round finishes."""

    applies: bool
    checked: int = 0
    identical: int = 0
    partings: list[Parting] = field(default_factory=list)

    def check(
        self,
        target: Model,
        prompt_tokens: Sequence[int],
        reference: Measurement,
        reference_tokens: list[int],
        candidate: Measurement,
        candidate_tokens: list[int],
    ) -> None:
        """One speculative generation (`candidate`) against the target-only one of its round."""
        self.checked += 1
        if candidate_tokens == reference_tokens:
            self.identical += 1
            return
        widest = max(candidate.stats.draft_lengths, default=0)
        labels = {
            "task": candidate.task, "prompt_index": candidate.prompt_index, "run": candidate.run,
            "spec": candidate.spec, "k": candidate.k, "verify_rows": widest + 1,
        }
        parting = find_parting(target, prompt_tokens, reference_tokens, candidate_tokens, widest)
        if parting is not None:
            self.partings.append(Parting(
                **labels,
                index=parting.index,
                target_token=parting.reference_token,
                speculative_token=parting.candidate_token,
                top_two_gap=parting.top_two_gap,
                tolerance=parting.tolerance,
                near_tie=bool(parting.near_tie),
                description=parting.describe(),
            ))
            return
        # Equal as far as both go, yet one is longer: with the end-of-generation token kept and the
        # same token limit on both sides, nothing explains that, so it fails like any other parting.
        shorter = min(len(reference_tokens), len(candidate_tokens))
        self.partings.append(Parting(
            **labels,
            index=shorter,
            target_token=None,
            speculative_token=None,
            top_two_gap=None,
            tolerance=None,
            near_tie=False,
            description=(
                f"outputs agree for {shorter} tokens, then one side stops ({reference.reason} alone vs "
                f"{candidate.reason} speculative) where the other goes on: not a near-tie"
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
