"""Every figure of one configuration (draft source and K) over a set of rounds: speeds and speedups
from wall-clock decode times, counts from the engine's RunStats added up (by source, and the K
chosen), and the prediction theory makes from them where it applies."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import reduce
from operator import add
from typing import Sequence

from speccli.bench.report import (
    Costs,
    Measurement,
    ObservedCosts,
    Prediction,
    SideSummary,
    SourceAcceptance,
    Spread,
    Summary,
    TimeSplit,
)
from speccli.bench.settings import Configuration
from speccli.bench.theory import estimate_alpha, expected_tokens_per_verify, predicted_speedup, prediction_not_applicable
from speccli.core.stats import RunStats
from speccli.validation import AUTO_K


@dataclass
class Round:
    """One prompt, one run: the target-only generation and one speculative generation per configuration."""

    task: str
    prompt_index: int
    run: int
    baseline: Measurement
    speculative: dict[Configuration, Measurement]


def spread(values: Sequence[float]) -> Spread | None:
    if not values:
        return None
    return Spread(median=statistics.median(values), min=min(values), max=max(values))


def total_stats(measurements: Sequence[Measurement]) -> RunStats:
    return reduce(add, (m.stats for m in measurements), RunStats())


def summarize(rounds: Sequence[Round], configuration: Configuration, costs: Costs) -> Summary:
    """Every figure for one configuration over some rounds (a task's, or all)."""
    k = configuration.k
    base = [r.baseline for r in rounds]
    spec = [r.speculative[configuration] for r in rounds]
    base_stats, spec_stats = total_stats(base), total_stats(spec)
    speedups = [
        s.wall_tokens_per_second / b.wall_tokens_per_second for b, s in zip(base, spec) if b.wall_tokens_per_second > 0
    ]
    steps, drafted, accepted = spec_stats.steps, spec_stats.drafted_counted, spec_stats.accepted
    judged = spec_stats.positions.judged
    alpha = estimate_alpha(accepted, judged)
    measured = statistics.median(speedups) if speedups else None
    not_applicable = prediction_not_applicable(configuration.spec, k)
    prediction = None
    if alpha is not None and not_applicable is None:
        e = expected_tokens_per_verify(alpha, k)
        step_cost = k * costs.c + costs.verify_ratio(k)
        prediction = Prediction(alpha=alpha, tokens_per_verify=e, step_cost=step_cost, speedup=e / step_cost)
    observed = None
    if base_stats.steps and base_stats.target_seconds and drafted and steps:
        target_per_step = base_stats.target_seconds / base_stats.steps
        # Per drafted token: the steps that drafted nothing (the sources asked, the policy's plan) are
        # not a token's cost, and where a source drafted on a handful of steps would swamp it.
        c = ((spec_stats.draft_seconds - spec_stats.undrafted_seconds) / spec_stats.drafted_whole) / target_per_step
        verify = (spec_stats.target_seconds / steps) / target_per_step
        observed = ObservedCosts(
            c=c,
            verify_relative_to_1_token=verify,
            predicted_speedup=predicted_speedup(alpha, k, c, verify) if alpha is not None and not_applicable is None else None,
        )
    positions = spec_stats.positions
    by_position = [a / d if d else None for a, d in zip(positions.accepted_at, positions.drafted_at)]
    by_position += [None] * ((0 if k == AUTO_K else k) - len(by_position))  # positions no step drafted
    return Summary(
        runs=len(rounds),
        baseline=_side(base, base_stats),
        speculative=_side(spec, spec_stats),
        speedup=spread(speedups),
        drafted=drafted,
        accepted=accepted,
        judged=judged,
        target_decodes=steps,
        acceptance_rate=accepted / drafted if drafted else None,
        per_position_acceptance=by_position,
        alpha=alpha,
        tokens_per_target_decode=spec_stats.generated / steps if steps else None,
        accepted_per_target_decode=accepted / steps if steps else None,
        draft_lengths=dict(sorted(spec_stats.draft_lengths.items())),
        mean_draft_length=spec_stats.mean_draft_length if steps else None,
        by_source=_by_source(spec_stats),
        observed_costs=observed,
        predicted=prediction,
        prediction_not_applicable=not_applicable,
        efficiency=measured / prediction.speedup if measured is not None and prediction else None,
    )


def _by_source(stats: RunStats) -> list[SourceAcceptance]:
    """Acceptance per draft source; a source's steps are those that drafted a token from it (a first
    token, or one after another source's, taking that draft over)."""
    figures = []
    for source, counts in sorted(stats.by_source.items()):
        figures.append(SourceAcceptance(
            source=source,
            steps=counts.drafted_at[0] if counts.drafted_at else 0,
            took_over=stats.take_overs.get(source, 0),
            drafted=counts.drafted,
            accepted=counts.accepted,
            judged=counts.judged,
            acceptance_rate=counts.accepted / counts.drafted if counts.drafted else None,
            alpha=estimate_alpha(counts.accepted, counts.judged),
        ))
    return figures


def _side(measurements: Sequence[Measurement], stats: RunStats) -> SideSummary:
    return SideSummary(
        wall_tokens_per_second=spread([m.wall_tokens_per_second for m in measurements]),
        prefill_seconds=spread([m.stats.prefill_seconds for m in measurements]),
        tokens=stats.generated,
        tokens_per_run=[m.stats.generated for m in measurements],
        stop_reasons=sorted({m.reason for m in measurements}),
        time_split=_time_split(stats, sum(m.decode_wall_seconds for m in measurements)),
    )


def _time_split(stats: RunStats, wall_seconds: float) -> TimeSplit:
    between = max(wall_seconds - stats.decode_seconds, 0.0)
    total = max(wall_seconds, stats.decode_seconds)
    host = max(total - stats.compute_seconds, 0.0)

    def fraction(seconds: float) -> float:
        return seconds / total if total else 0.0

    return TimeSplit(
        draft_seconds=stats.draft_seconds,
        catch_up_seconds=stats.catch_up_seconds,
        target_seconds=stats.target_seconds,
        other_seconds=stats.other_seconds,
        between_steps_seconds=between,
        draft_fraction=fraction(stats.draft_seconds),
        catch_up_fraction=fraction(stats.catch_up_seconds),
        target_fraction=fraction(stats.target_seconds),
        other_fraction=fraction(stats.other_seconds),
        between_steps_fraction=fraction(between),
        host_us_per_row=host / stats.target_rows * 1e6 if stats.target_rows else None,
        host_us_per_step=host / stats.steps * 1e6 if stats.steps else None,
        draft_prompt_seconds=stats.draft_prompt_seconds,
        draft_prompt_fraction=fraction(stats.draft_prompt_seconds),
    )
