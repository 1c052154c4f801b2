"""The one line a bench report gives where speculation did not pay: every configuration slower than the
target alone, or `auto` drafting nothing. It names the costs that decide it (c, v(n)), so a figure below
1x is never left to speak for itself, and it says speculation *cannot* pay only where those costs say
so at the acceptance measured: a short or unlucky run is slower without proving anything."""
from __future__ import annotations

from typing import Sequence

from speccli.bench.report import ConfigResult, Costs
from speccli.bench.theory import predicted_speedup
from speccli.drafting.registry import uses_lookup
from speccli.validation import AUTO_K


def cannot_pay(results: Sequence[ConfigResult], costs: Costs) -> str | None:
    """The line (saying speculation cannot pay where the costs say so), or None where some configuration
    gains and auto (if asked for) drafted."""
    measured = [r for r in results if r.overall.speedup]
    all_slower = bool(measured) and len(measured) == len(results) and all(r.overall.speedup.median < 1 for r in measured)
    idle_auto = [r for r in results if r.k == AUTO_K and r.overall.drafted == 0]
    if not all_slower and not idle_auto:
        return None
    costs_phrase = f"on this machine {_costs_phrase(costs)}"
    idle = " and ".join(r.label for r in idle_auto)
    gaining = [r for r in measured if r not in idle_auto and r.overall.speedup.median >= 1]
    if idle_auto and gaining:
        # auto judged drafting not worth it, yet a fixed configuration gained: say both, claim neither
        best = max(gaining, key=lambda r: r.overall.speedup.median)
        return (
            f"{costs_phrase}: {idle} judged that drafting does not pay and decoded with the target alone, "
            f"though {best.label} measured {best.overall.speedup.median:.2f}×"
        )
    findings = []
    if all_slower:
        best = max(measured, key=lambda r: r.overall.speedup.median)
        figures = f"{best.overall.speedup.median:.2f}×, acceptance {_rate(best.overall.acceptance_rate)}"
        if len(results) > 1:
            findings.append(f"every configuration is slower than the target alone (best: {best.label} at {figures})")
        else:
            findings.append(f"{best.label} is slower than the target alone ({figures})")
    if idle_auto:
        findings.append(f"{idle} drafted nothing: it decoded with the target alone")
    if not any(_could_pay(r, costs) for r in results):
        return f"{costs_phrase}: speculation cannot pay here at the acceptance measured; " + "; ".join(findings)
    return (f"{costs_phrase}: " + "; ".join(findings) + "; yet at these costs and the acceptance measured some K "
            "would gain, so this run is no verdict on speculation here")


def _could_pay(result: ConfigResult, costs: Costs) -> bool:
    """Whether some K beats the target alone at these costs: with the acceptance this configuration
    measured (every draft kept where it judged none), a draft model's token at c, a lookup's at 0."""
    alpha = result.overall.alpha if result.overall.alpha is not None else 1.0
    # Any spec with the lookup is priced as the lookup alone, at 0: an optimistic bound, so that a line
    # saying it cannot pay is never wrong.
    c = 0.0 if uses_lookup(result.spec) else costs.c
    return any(predicted_speedup(alpha, v.k, c, v.relative_to_1_token) > 1 for v in costs.verify if v.k > 0)


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _costs_phrase(costs: Costs) -> str:
    verify = ", ".join(f"{v.relative_to_1_token:.2f} (n={v.tokens})" for v in costs.verify)
    draft = (
        f"the draft model costs c = {costs.c:.2f} of a target step"
        if costs.draft_decode_1_seconds is not None
        else "n-gram lookup costs no model step (c = 0)"
    )
    return f"{draft} and verifying n tokens costs v(n) ≈ {verify} target steps"
