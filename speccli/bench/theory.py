"""What theory expects of speculative decoding, from measured acceptance and costs: tokens per verify,
predicted speedup (Leviathan et al. 2023, sec. 3.4, with the verify cost measured instead of assumed 1),
the alpha estimate, where the formula applies, and which configuration is best and why."""
from __future__ import annotations

from typing import Sequence

from speccli.bench.report import Best, ConfigResult
from speccli.drafting.registry import uses_lookup
from speccli.validation import AUTO_K, K


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


def prediction_not_applicable(spec: str, k: K) -> str | None:
    """Why the formula does not describe a configuration (None where it does: a fixed K, model drafts).
    It assumes K drafted tokens every step at cost c each, accepted independently with one alpha."""
    if k == AUTO_K:
        return "auto: K varies per step, the formula assumes one fixed K"
    if uses_lookup(spec):
        return f"{spec}: lookup drafts cost no model step and their acceptance is not one alpha"
    return None


def best_configuration(results: Sequence[ConfigResult]) -> Best | None:
    """The configuration with the highest median measured speedup, and why, in words (None for one)."""
    scored = [r for r in results if r.overall.speedup]
    if len(scored) < 2:
        return None
    ranked = sorted(scored, key=lambda r: r.overall.speedup.median, reverse=True)
    best, runner_up = ranked[0], ranked[1]
    speedup = best.overall.speedup
    standing = (
        f"{best.label} has the highest measured speedup" if speedup.median >= 1
        else f"none is faster than the target alone; {best.label} comes closest"
    )
    reason = f"{standing}: {_yield_phrase(best, named=False)}; next is {_yield_phrase(runner_up)}"
    predicted = [r for r in scored if r.overall.predicted]
    if len(predicted) >= 2:
        theory = max(predicted, key=lambda r: r.overall.predicted.speedup)
        if theory is best:
            reason += f". Of the fixed-K model configurations, the prediction from measured alpha, c and v also puts {best.label} first"
        else:
            reason += f". Of the fixed-K model configurations, the prediction from measured alpha, c and v puts {theory.label} first"
    close = [r.label for r in scored if r is not best and r.overall.speedup.max >= speedup.min]
    if close:
        reason += f"; {best.label}'s min-max range overlaps that of {', '.join(close)}, so more --runs may change the order"
    return Best(label=best.label, spec=best.spec, k=best.k, speedup=speedup.median, reason=reason + ".")


def _yield_phrase(result: ConfigResult, named: bool = True) -> str:
    overall = result.overall
    pred = overall.predicted
    text = (f"{result.label}: " if named else "") + f"{overall.speedup.median:.2f}x measured"
    if pred:
        text += (
            f" (alpha {pred.alpha:.2f} predicts {pred.tokens_per_verify:.2f} tokens per verify for "
            f"{pred.step_cost:.2f} target-decode costs: {pred.speedup:.2f}x)"
        )
    elif overall.tokens_per_target_decode is not None:
        text += (
            f" ({overall.tokens_per_target_decode:.2f} tokens per target decode, "
            f"mean K {overall.mean_draft_length or 0:.2f})"
        )
    return text
