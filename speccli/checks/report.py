"""The typed quant-check report: figures per candidate derived from a `FidelityMeasurement`, ranked, and its JSON.

Derived figures:
* tokens per verify at K drafts: 1 + α + … + α^K, with α the mean expected acceptance (as if each
  draft token were accepted independently at that rate);
* predicted speedup as a draft, only for a candidate whose 1-token decode is clearly faster than the
  reference's (at most CLEARLY_FASTER of its time): tokens per verify × t_ref(1) / (K·t_cand(1) +
  t_ref(K+1)), with each t a measured median decode time (t_ref(K+1): the reference verifying K
  drafts in one batch); the best K is shown.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from speccli.bench.theory import expected_tokens_per_verify, predicted_speedup
from speccli.checks.fidelity import MAX_VERIFY, CandidateMeasurement, FidelityMeasurement, TopTokens
from speccli.checks.reference_store import STORED_RANGE
from speccli.checks.verdict import RULE, Fidelity, judge
from speccli.core.sampling import SamplingParams
from speccli.util.format import json_safe

STRETCH_EDGES = (0, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 1 << 30)
CONTEXT_TOKENS = 12  # tokens of context shown before a worst position


class _Tokenizer(Protocol):
    def token_bytes(self, token: int) -> bytes: ...


@dataclass(frozen=True)
class TokenProbability:
    token: int
    text: str
    probability: float


@dataclass(frozen=True)
class Evidence:
    sequence: str
    offset: int
    context: str  # the text just before the predicted token
    actual_next: str | None  # the token the text has there (None after its last token)
    acceptance: float
    kl: float
    reference_top: list[TokenProbability]
    candidate_top: list[TokenProbability]


@dataclass(frozen=True)
class Stretch:
    positions: str  # offsets in the sequence, e.g. "64-127"
    count: int
    acceptance: float


@dataclass(frozen=True)
class DraftSpeedup:
    k: int
    tokens_per_verify: float
    speedup: float


@dataclass(frozen=True)
class CandidateReport:
    name: str  # as the command line gave it: a registry name, or a path
    path: str
    verdict: Fidelity
    reason: str
    acceptance: float  # mean Σ min(p, q) at the sampling settings
    acceptance_stderr: float
    greedy_acceptance: float  # raw top-1 agreement (llama.cpp's "same top")
    kl_mean: float  # llama.cpp's "mean KLD", nats
    kl_p99: float  # llama.cpp's "99.0% KLD"
    tokens_per_verify: dict[int, float]  # K -> expected tokens per target decode
    seconds_per_token: float
    draft_speedup: DraftSpeedup | None  # None when the candidate is not faster than the reference
    by_position: list[Stretch]
    worst: list[Evidence]


@dataclass(frozen=True)
class QuantCheckReport:
    reference: str
    text: str
    sequences: int
    positions: int
    context: int  # the context each model was loaded with: no sequence is longer
    sampling: dict[str, float]
    sequential: bool
    reference_storage: str
    reference_seconds_per_token: float
    seconds: float
    rule: str
    candidates: list[CandidateReport]  # ranked: highest expected acceptance first

    @property
    def exit_code(self) -> int:
        return 1 if any(c.verdict is Fidelity.BROKEN for c in self.candidates) else 0

    def to_json(self) -> str:
        return json.dumps(json_safe(asdict(self) | {"exit_code": self.exit_code}), indent=2, default=str)


def build_report(
    measurement: FidelityMeasurement, names: list[str], tokenizer: _Tokenizer, params: SamplingParams, text: str, context: int
) -> QuantCheckReport:
    """`names`: each candidate as the command line gave it, in the measurement's order."""
    candidates = [_candidate(measurement, c, name, tokenizer) for c, name in zip(measurement.candidates, names, strict=True)]
    candidates.sort(key=lambda c: (-c.acceptance, c.kl_mean))
    storage = (
        f"reference log-probabilities stored on disk as uint16 over the top {STORED_RANGE:g} nats of each row (llama.cpp's "
        "--kl-divergence-base scheme), memory-mapped" if measurement.sequential
        else "reference and candidate loaded together; exact float32 rows"
    )
    return QuantCheckReport(
        reference=str(measurement.reference),
        text=text,
        sequences=len(measurement.sequences),
        positions=len(measurement.offsets),
        context=context,
        sampling={"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p},
        sequential=measurement.sequential,
        reference_storage=storage,
        reference_seconds_per_token=measurement.reference_seconds[1],
        seconds=measurement.seconds,
        rule=RULE,
        candidates=candidates,
    )


def _candidate(
    measurement: FidelityMeasurement, candidate: CandidateMeasurement, name: str, tokenizer: _Tokenizer
) -> CandidateReport:
    acceptance = float(candidate.acceptance.mean())
    stretches = _stretches(measurement.offsets, candidate.acceptance)
    n = len(candidate.acceptance)
    verdict, reason = judge(
        acceptance, [(s.positions, s.count, s.acceptance) for s in stretches], int(candidate.broken.sum()), n
    )
    return CandidateReport(
        name=name,
        path=str(candidate.path),
        verdict=verdict,
        reason=reason,
        acceptance=acceptance,
        acceptance_stderr=float(candidate.acceptance.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
        greedy_acceptance=float(candidate.same_top.mean()),
        kl_mean=float(candidate.kl.mean()),
        kl_p99=_percentile_99(candidate.kl),
        tokens_per_verify={k: expected_tokens_per_verify(acceptance, k) for k in range(1, MAX_VERIFY)},
        seconds_per_token=candidate.seconds_per_token,
        draft_speedup=predict_draft_speedup(acceptance, candidate.seconds_per_token, measurement.reference_seconds),
        by_position=stretches,
        worst=[_evidence(measurement, w, tokenizer) for w in candidate.worst],
    )


def _percentile_99(values: np.ndarray) -> float:
    """np.percentile, with infinite values (positions whose logits were not finite) giving infinity
    where its interpolation between two of them would give NaN."""
    with np.errstate(invalid="ignore"):
        value = float(np.percentile(values, 99))
    return math.inf if math.isnan(value) else value


# A candidate whose token takes more than this share r of the reference's is not shown as a draft:
# even with every token kept and verification free, K drafted tokens yield K+1 for K·r + 1 target
# steps, at most 1/r (1.11x at r = 0.9), and the prediction rests on a few timing medians, which move
# by that much on a shared machine (a model checked against itself was predicted 1.03x).
CLEARLY_FASTER = 0.9


def predict_draft_speedup(acceptance: float, draft_seconds: float, reference_seconds: dict[int, float]) -> DraftSpeedup | None:
    if draft_seconds > CLEARLY_FASTER * reference_seconds[1]:
        return None
    unit = reference_seconds[1]  # the formula's costs are in the reference's 1-token decodes
    options = [
        DraftSpeedup(k, expected_tokens_per_verify(acceptance, k),
                     predicted_speedup(acceptance, k, draft_seconds / unit, reference_seconds[k + 1] / unit))
        for k in range(1, MAX_VERIFY)
    ]
    return max(options, key=lambda option: option.speedup)


def _stretches(offsets: np.ndarray, acceptance: np.ndarray) -> list[Stretch]:
    result = []
    for low, high in zip(STRETCH_EDGES, STRETCH_EDGES[1:]):
        inside = (offsets >= low) & (offsets < high)
        count = int(inside.sum())
        if count:
            result.append(Stretch(f"{low}-{high - 1}" if high < STRETCH_EDGES[-1] else f"{low}+", count, float(acceptance[inside].mean())))
    return result


def _text(tokenizer: _Tokenizer, tokens) -> str:
    return b"".join(tokenizer.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")


def _top(tokenizer: _Tokenizer, top: TopTokens) -> list[TokenProbability]:
    return [TokenProbability(t, _text(tokenizer, [t]), p) for t, p in zip(top.tokens, top.probabilities)]


def _evidence(measurement: FidelityMeasurement, worst, tokenizer: _Tokenizer) -> Evidence:
    sequence = measurement.sequences[worst.sequence]
    tokens = sequence.tokens
    start = max(0, worst.offset + 1 - CONTEXT_TOKENS)
    following = tokens[worst.offset + 1] if worst.offset + 1 < len(tokens) else None
    return Evidence(
        sequence=sequence.name,
        offset=worst.offset,
        context=_text(tokenizer, tokens[start : worst.offset + 1]),
        actual_next=None if following is None else _text(tokenizer, [following]),
        acceptance=worst.acceptance,
        kl=worst.kl,
        reference_top=_top(tokenizer, worst.reference_top),
        candidate_top=_top(tokenizer, worst.candidate_top),
    )
