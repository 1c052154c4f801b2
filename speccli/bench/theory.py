"""What theory expects of speculative decoding, from measured acceptance and costs: tokens per verify,
predicted speedup (Leviathan et al. 2023, sec. 3.4, with the verify cost measured instead of assumed 1),
the alpha estimate, and which K is best and why."""
from __future__ import annotations

from typing import Sequence

from speccli.bench.report import BestK, KResult


def expected_tokens_per_verify(alpha: float, k: int) -> float:
    """E = (1 - alpha^(K+1)) / (1 - alpha): tokens one verify yields, its correction/bonus token included."""
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, verify_ratio: float) -> float:
    """S = E(alpha, K) / (K*c + v(K+1)), in units of the target's 1-token decode (Leviathan et al. 2023)."""
    return expected_tokens_per_verify(alpha, k) / (k * c + verify_ratio)


def estimate_alpha(accepted: int, judged: int) -> float | None:
    """Conditional per-token acceptance: kept / judged (a step judges its kept drafts and its first
    rejected one), the geometric model's maximum-likelihood estimate."""
    return accepted / judged if judged else None


def best_k(results: Sequence[KResult]) -> BestK | None:
    """The K with the highest median measured speedup, and why, in words (None for a single K)."""
    scored = [r for r in results if r.overall.speedup]
    if len(scored) < 2:
        return None
    best = max(scored, key=lambda r: r.overall.speedup.median)
    k, speedup = best.k, best.overall.speedup
    reason = f"K={k} has the highest measured speedup: {_yield_phrase(best, named=False)}"
    neighbours = [r for r in scored if r.k < k][-1:] + [r for r in scored if r.k > k][:1]
    if neighbours:
        reason += "; against " + " and ".join(_yield_phrase(r) for r in neighbours)
        reason += (
            ". Smaller K yields fewer tokens per verify; larger K pays K draft steps and a wider verify for "
            "drafts that are more and more often rejected"
        )
    predicted = [r for r in scored if r.overall.predicted]
    if predicted:
        theory = max(predicted, key=lambda r: r.overall.predicted.speedup).k
        if theory == k:
            reason += f". The prediction from measured alpha, c and v also puts K={k} first"
        else:
            reason += f". The prediction from measured alpha, c and v puts K={theory} first instead"
    close = [r.k for r in scored if r is not best and r.overall.speedup.max >= speedup.min]
    if close:
        reason += f"; K={','.join(map(str, close))} overlap(s) its min-max range, so more --runs may change the order"
    return BestK(k=k, speedup=speedup.median, reason=reason + ".")


def _yield_phrase(result: KResult, named: bool = True) -> str:
    overall = result.overall
    pred = overall.predicted
    text = (f"K={result.k}: " if named else "") + f"{overall.speedup.median:.2f}x measured"
    if pred:
        text += (
            f" (alpha {pred.alpha:.2f}: {pred.tokens_per_verify:.2f} tokens per verify for "
            f"{pred.step_cost:.2f} target-decode costs, predicted {pred.speedup:.2f}x)"
        )
    return text
