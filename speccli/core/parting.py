"""Where greedy speculative output parts from the target's own greedy output, and why.

Greedy speculative decoding takes the argmax of the target's *batched* verification logits; the
target alone takes the argmax of its *single-token* logits. llama.cpp does not compute the two
identically (different kernels and accumulation order for a batch of K+1 rows): measured on a
96-token Gemma 3 270M continuation, top-10 logits differ by at most 0.04 for the F32 file but by up
to 1.7 for the Q4_K_M one. Where the target's top two tokens are closer than that, the two runs can
legitimately choose differently. A parting anywhere else is a bug.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from speccli.util.sequences import common_prefix_length

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model


TOP_COMPARED = 10  # logits compared between batched and single decodes: the ones that can win
# Batch alignments measured: a row's logits depend on where it sits in its batch, and a run's verifies
# sit anywhere. One alignment had given Qwen 1.5B Q4_K_M a tolerance of 0.325 where a bench run parted
# at a gap of 0.352 (docs/exactness.md).
ALIGNMENTS = 4


@dataclass(frozen=True)
class PartingPoint:
    """Where two greedy outputs first part, and whether a near-tie explains it (bench's report
    records one as a `speccli.bench.report.Parting`)."""

    index: int  # first generated position where the two outputs differ
    reference_token: int  # the target-only choice there
    candidate_token: int  # the speculative choice there
    top_two_gap: float  # target's single-token logits at that position: best minus second best
    tolerance: float  # largest batched-vs-single difference of top logits measured for this model

    @property
    def near_tie(self) -> bool:
        return self.top_two_gap <= self.tolerance

    def describe(self) -> str:
        verdict = "a near-tie" if self.near_tie else "NOT a near-tie: a bug"
        return (
            f"outputs part at generated token {self.index} (target alone: {self.reference_token}, "
            f"speculative: {self.candidate_token}); the target's top-two logit gap there is "
            f"{self.top_two_gap:.3f}, the batched-vs-single difference measured for this model is up to "
            f"{self.tolerance:.3f}: {verdict}"
        )


def find_parting(
    target: Model, prompt: Sequence[int], reference: Sequence[int], candidate: Sequence[int], k: int
) -> PartingPoint | None:
    """None if `candidate` agrees with `reference` wherever both have tokens.

    Decodes the reference continuation token by token, and in batches of k+1 rows as verification
    does, at up to ALIGNMENTS offsets; leaves the target's cache empty.
    """
    index = common_prefix_length(reference, candidate)
    if index == min(len(reference), len(candidate)):
        return None
    positions = [*prompt[-1:], *reference[:-1]]  # the tokens whose logits choose reference[0..]
    single = _logit_rows(target, prompt, positions, rows_per_decode=1)
    top = np.argsort(-single, axis=1)[:, :TOP_COMPARED]
    tolerance = 0.0
    for offset in range(min(k + 1, ALIGNMENTS)):
        batched = _logit_rows(target, prompt, positions, rows_per_decode=k + 1, offset=offset)
        difference = np.abs(np.take_along_axis(single, top, axis=1) - np.take_along_axis(batched, top, axis=1))
        tolerance = max(tolerance, float(difference.max()))
    best, second = np.take_along_axis(single[index], top[index, :2], axis=0)
    return PartingPoint(index, reference[index], candidate[index], float(best - second), tolerance)


def _logit_rows(target: Model, prompt: Sequence[int], positions: Sequence[int], rows_per_decode: int,
                offset: int = 0) -> np.ndarray:
    """The logits of each of `positions` after `prompt`, decoded `rows_per_decode` at a time, the first
    batch `offset` rows short (so each row sits elsewhere in its batch)."""
    target.reset()
    if len(prompt) > 1:
        target.decode(prompt[:-1], n_logit_rows=0)
    rows = []
    starts = [0, *range(offset or rows_per_decode, len(positions), rows_per_decode)]
    for start, end in zip(starts, [*starts[1:], len(positions)]):
        chunk = positions[start:end]
        rows.append(np.array(target.decode(chunk, n_logit_rows=len(chunk))))
    target.reset()
    return np.concatenate(rows)
