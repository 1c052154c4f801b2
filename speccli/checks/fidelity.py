"""The measurement behind `quant-check`: teacher-force a reference and candidates over the same tokens
and compare their next-token distributions position by position (the figures, acceptance, KL and
top-1: `speccli.checks.distributions`).

Memory stays bounded: logits are decoded and compared CHUNK rows at a time, and only scalars per
position are kept (plus the top tokens of the few worst positions). By default the reference and one
candidate are loaded together and the reference is decoded again for each candidate (exact float32
rows). In sequential mode only one model is loaded at a time, the reference first, its rows stored on
disk (`speccli.checks.reference_store`: the only approximation, and a small one).
"""
from __future__ import annotations

import heapq
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from speccli.checks.distributions import ReferenceRows, RowComparator, finite_rows, log_softmax
from speccli.checks.reference_store import ReferenceStore
from speccli.core.sampling import SamplingParams
from speccli.errors import SpeccliError
from speccli.llama.model import LoadOptions, Model

CHUNK = 32  # rows decoded and compared at once: 32 MB per float32 array for a 262k vocabulary
TOP_SHOWN = 3  # top tokens shown for a worst position
WORST_KEPT = 5  # worst positions kept as evidence, per candidate
MAX_VERIFY = 9  # the reference's decode cost is measured for 1..MAX_VERIFY tokens (K = 1..8 drafts)
TIMING_REPEATS = 5
WARM_UP_SECONDS = 0.2  # of untimed 1-token decodes before a model's timings

Progress = Callable[[str, int], None]  # (what is running, positions just done)


@dataclass(frozen=True)
class TokenSequence:
    name: str
    tokens: list[int]


@dataclass(frozen=True)
class TopTokens:
    tokens: tuple[int, ...]
    probabilities: tuple[float, ...]


@dataclass(frozen=True)
class WorstPosition:
    sequence: int  # index into the measured sequences
    offset: int  # the logits row after tokens[: offset + 1], predicting tokens[offset + 1]
    acceptance: float
    kl: float
    reference_top: TopTokens
    candidate_top: TopTokens


@dataclass
class CandidateMeasurement:
    path: Path
    acceptance: np.ndarray  # float64 per position: Σ min(p, q)
    kl: np.ndarray  # float64 per position: KL(p‖q), raw distributions
    same_top: np.ndarray  # bool per position: raw argmaxes agree
    broken: np.ndarray  # bool per position: the candidate's logits hold a NaN or +inf there
    worst: list[WorstPosition]
    seconds_per_token: float  # median time of a 1-token decode (one logits row)


@dataclass
class FidelityMeasurement:
    """All that quant-check measured: the positions compared, the reference's decode times, and each
    candidate's figures against the reference."""

    reference: Path
    sequences: list[TokenSequence]
    sequence_index: np.ndarray  # per position: which sequence
    offsets: np.ndarray  # per position: where in its sequence
    reference_seconds: dict[int, float]  # tokens decoded at once -> median seconds (1..MAX_VERIFY)
    candidates: list[CandidateMeasurement]
    sequential: bool
    seconds: float = 0.0


def _refuse_broken_reference(path: Path, logits: np.ndarray, sequence: int, start: int) -> None:
    broken = np.flatnonzero(~finite_rows(logits))
    if len(broken):
        raise SpeccliError(
            f"{path}: its logits are not finite (NaN or infinity) at position {start + int(broken[0])} of "
            f"sequence {sequence + 1}, so it cannot serve as the reference: check the file against its source"
        )


def _top(row: np.ndarray, count: int = TOP_SHOWN) -> TopTokens:
    head = np.argpartition(row, len(row) - count)[-count:]
    head = head[np.argsort(-row[head], kind="stable")]
    return TopTokens(tuple(int(t) for t in head), tuple(float(row[t]) for t in head))


class _Accumulator:
    """Scalars per position for one candidate, and a bounded heap of its worst positions."""

    def __init__(self, n_positions: int) -> None:
        self.acceptance = np.empty(n_positions)
        self.kl = np.empty(n_positions)
        self.same_top = np.empty(n_positions, dtype=bool)
        self.broken = np.empty(n_positions, dtype=bool)
        self.filled = 0
        self._worst: list[tuple[float, int, WorstPosition]] = []  # max-heap on acceptance via negation

    def add(self, sequence: int, first_offset: int, reference: ReferenceRows, figures) -> None:
        acceptance, kl, same_top, q, broken = figures
        n = len(acceptance)
        span = slice(self.filled, self.filled + n)
        self.acceptance[span], self.kl[span], self.same_top[span], self.broken[span] = acceptance, kl, same_top, broken
        for row in np.argsort(acceptance)[:WORST_KEPT]:
            key = -float(acceptance[row])
            if len(self._worst) == WORST_KEPT and key <= self._worst[0][0]:
                continue  # not worse than the best of the worst kept
            entry = WorstPosition(
                sequence, first_offset + int(row), float(acceptance[row]), float(kl[row]),
                _top(reference.p[row]), _top(q[row]),
            )
            item = (key, self.filled + int(row), entry)
            if len(self._worst) < WORST_KEPT:
                heapq.heappush(self._worst, item)
            else:
                heapq.heapreplace(self._worst, item)
        self.filled += n

    def worst(self) -> list[WorstPosition]:
        return [entry for _, _, entry in sorted(self._worst, key=lambda item: (-item[0], item[1]))]  # worst first


def decode_seconds(model: Model, context: Sequence[int], sizes: Sequence[int]) -> dict[int, float]:
    """Median wall time to decode `size` tokens (with their logits rows) after `context`."""
    model.reset()
    model.decode(list(context), n_logit_rows=0)
    base = model.n_past
    filler = list(context) * (1 + max(sizes) // max(len(context), 1))
    # Untimed first: right after a load the first decodes run slow (pages touched for the first time, a
    # CPU clocked down while idle), and the reference is timed right after its load, a candidate after
    # the reference has kept the CPU busy: a file timed against itself came out 0.7-0.8 of its own time.
    warm_until = time.perf_counter() + WARM_UP_SECONDS
    while time.perf_counter() < warm_until:
        model.decode(filler[:1], n_logit_rows=1)
        model.truncate(base)
    timings: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(TIMING_REPEATS):  # interleaved: a drift in the machine's speed touches every size alike
        for size in sizes:
            timings[size].append(model.time_decode(filler[:size], n_logit_rows=size))
    model.reset()
    return {size: statistics.median(times) for size, times in timings.items()}


def measure(
    reference_path: Path,
    candidate_paths: Sequence[Path],
    sequences: Sequence[TokenSequence],
    params: SamplingParams,
    options: LoadOptions,
    *,
    sequential: bool,
    progress: Progress | None = None,
) -> FidelityMeasurement:
    """Teacher-force every sequence through the reference and each candidate; see the module docstring."""
    started = time.perf_counter()
    advance = progress or (lambda _what, _done: None)
    comparator = RowComparator(params)
    sequence_index = np.concatenate([np.full(len(s.tokens), i) for i, s in enumerate(sequences)])
    offsets = np.concatenate([np.arange(len(s.tokens)) for s in sequences])
    n_positions = len(offsets)
    timing_context = sequences[0].tokens[:32]
    candidates: list[CandidateMeasurement] = []

    def chunks():
        position = 0
        for index, sequence in enumerate(sequences):
            for start in range(0, len(sequence.tokens), CHUNK):
                chunk = sequence.tokens[start : start + CHUNK]
                yield index, start, position, chunk
                position += len(chunk)

    def run_candidate(path: Path, reference_rows) -> None:
        with Model(path, options) as candidate:
            seconds = decode_seconds(candidate, timing_context, [1])[1]
            accumulator = _Accumulator(n_positions)
            for index, start, position, chunk in chunks():
                if start == 0:
                    candidate.reset()
                rows = reference_rows(index, start, position, chunk)
                logits = candidate.decode(chunk, n_logit_rows=len(chunk))
                accumulator.add(index, start, rows, comparator.compare(rows, logits))
                advance(path.name, len(chunk))
        candidates.append(CandidateMeasurement(
            path, accumulator.acceptance, accumulator.kl, accumulator.same_top, accumulator.broken, accumulator.worst(), seconds
        ))

    if sequential:
        with tempfile.TemporaryDirectory(prefix="speccli-quant-check-") as directory:
            with Model(reference_path, options) as reference:
                reference_seconds = decode_seconds(reference, timing_context, range(1, MAX_VERIFY + 1))
                store = ReferenceStore(Path(directory), n_positions, reference.n_vocab)
                for index, start, position, chunk in chunks():
                    if start == 0:
                        reference.reset()
                    logits = reference.decode(chunk, n_logit_rows=len(chunk))
                    _refuse_broken_reference(reference_path, logits, index, start)
                    store.write(position, log_softmax(logits))
                    advance(reference_path.name, len(chunk))
            for path in candidate_paths:
                run_candidate(path, lambda _i, _s, position, chunk: comparator.reference_from_log_p(store.read(position, len(chunk))))
    else:
        with Model(reference_path, options) as reference:
            reference_seconds = decode_seconds(reference, timing_context, range(1, MAX_VERIFY + 1))

            def decoded_reference(index, start, _position, chunk):
                if start == 0:
                    reference.reset()
                logits = reference.decode(chunk, n_logit_rows=len(chunk))
                _refuse_broken_reference(reference_path, logits, index, start)
                return comparator.reference(logits)

            for path in candidate_paths:
                run_candidate(path, decoded_reference)
    return FidelityMeasurement(
        reference_path, list(sequences), sequence_index, offsets, reference_seconds, candidates, sequential,
        seconds=time.perf_counter() - started,
    )


def memory_is_short(reference: Path, candidates: Sequence[Path]) -> bool:
    """Whether the reference and the largest candidate, loaded together, would not fit in the memory
    available now with 1 GiB to spare (then `measure` should run sequentially)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return False  # not Linux: no way to tell, so keep the exact mode
    needed = reference.stat().st_size + max(path.stat().st_size for path in candidates) + (1 << 30)
    return needed > available
