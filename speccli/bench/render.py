"""The human-readable bench report: rich tables, text and a text chart, each a pure function of the
typed report (nothing here measures or reads files)."""
from __future__ import annotations

import statistics
from typing import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speccli.bench.report import (
    BenchReport,
    Best,
    ConfigResult,
    GreedyCheck,
    Measurement,
    Settings,
    Spread,
    Summary,
    TimeSplit,
)
from speccli.util.format import counted, format_size

_COLUMNS = (
    ("tokens\nA/B", "right"),
    ("target-only\ntok/s", "right"),
    ("speculative\ntok/s", "right"),
    ("speedup", "right"),
    ("accept\nrate", "right"),
    ("α\n(est.)", "right"),
    ("tok/\nverify", "right"),
    ("mean K\nchosen", "right"),
    ("predicted\nspeedup", "right"),
    ("effi-\nciency", "right"),
)


def number(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def spread_text(s: Spread | None, digits: int = 1, suffix: str = "") -> str:
    if not s:
        return "–"
    return f"{s.median:.{digits}f}{suffix} [dim]({s.min:.{digits}f}–{s.max:.{digits}f})[/dim]"


def _mode(settings: Settings) -> str:
    mode = "greedy" if settings.greedy else f"temperature {settings.temperature:g}, seed {settings.seed}"
    filters = [
        f"{name} {value:g}"
        for name, value, off in (("top-k", settings.top_k, 0), ("top-p", settings.top_p, 1.0), ("min-p", settings.min_p, 0.0))
        if value != off
    ]
    return ", ".join([mode, *filters])


def render_report(report: BenchReport, console: Console) -> None:
    settings, env, models, costs = report.settings, report.environment, report.models, report.costs
    pair = f"pair {escape(models.pair)}" if models.pair else "ad-hoc pair"
    console.print(
        f"[bold]speccli bench[/bold] · {pair} · spec {','.join(settings.spec)} · K={','.join(map(str, settings.k))} · "
        f"{_mode(settings)} · {settings.n_predict} new tokens max · {settings.runs} run(s) + {settings.warmup} warm-up · "
        f"{report.prompts.count} prompt(s) ({escape(report.prompts.source)})"
    )
    console.print(f"  [dim]{escape(report.command)}[/dim]", soft_wrap=True)
    for role, model in (("target", models.target), ("draft", models.draft)):
        if model is None:
            console.print(f"  {role:<6} none (n-gram lookup drafts from the context)")
        else:
            translated = (f", another vocabulary: drafts {models.draft_proposes}"
                          if role == "draft" and models.draft_proposes in ("text", "shared tokens") else "")
            console.print(f"  {role:<6} {escape(model.name)} ({format_size(model.size_bytes)}, sha256 {model.sha256[:12]}{translated})")
    if not env.gpu_offload_supported:
        offload = "no GPU offload"
    elif env.draft_n_gpu_layers is None:
        offload = f"ngl {env.target_n_gpu_layers}"
    else:
        offload = f"ngl {env.target_n_gpu_layers}/{env.draft_n_gpu_layers}"
    console.print(f"  {env.backend} · {env.threads} threads · {offload} · llama-cpp-python {env.llama_cpp_python}")
    if "RPC" in env.target_runs_on or "RPC" in (env.draft_runs_on or ""):
        draft_place = f", draft on {env.draft_runs_on}" if env.draft_runs_on else ""
        console.print(f"  target on {escape(env.target_runs_on)}{escape(draft_place)}")
    verify = ", ".join(f"K={v.k}: {v.relative_to_1_token:.2f}" for v in costs.verify)
    draft = (
        f"draft {costs.draft_decode_1_seconds * 1e3:.1f} ms → c = {costs.c:.3f}"
        if costs.draft_decode_1_seconds is not None
        else "no draft model → c = 0"
    )
    console.print(
        f"  profiled: target 1-token decode {costs.target_decode_1_seconds * 1e3:.1f} ms, {draft}; "
        f"(K+1)-token verify / 1-token decode: {verify}"
    )
    if len(report.results) == 1:
        render_single(report.results[0], console)
    else:
        render_sweep(report.results, report.best, report.measurements, console)
    if report.cannot_pay:
        console.print(f"[bold yellow]{escape(report.cannot_pay)}[/bold yellow]", soft_wrap=True)
    # The task table, and its "target alone ±" column, comes with several configurations only.
    spread = (
        "target alone ±: half the range of the target alone's tok/s over a task's runs, the noise that task's "
        "speedups carry on this machine. " if len(report.results) > 1 else ""
    )
    console.print(
        "[dim]tok/s: decode phase, wall-clock, median (min–max) over a task's runs (overall: over every prompt's "
        "runs); speedup: median of per-round ratios. "
        "tok/verify counts the target's correction/bonus token; mean K chosen counts steps that drafted nothing. "
        "predicted = (1−α^(K+1))/(1−α) ÷ (K·c + v(K+1)) from measured α, c, v — a prediction, not a measurement, "
        "for a fixed K with a model draft only (n/a otherwise); efficiency = measured ÷ predicted. "
        f"{spread}catch-up: the part of drafting a draft model spent taking in tokens it skipped while the "
        "lookup drafted; + draft's prompt: a draft model taking in the prompt at its first draft, timed with the "
        "prefill (outside tok/s), as a share of the decode phase.[/dim]"
    )
    render_check(report.greedy_check, console)
    if report.stopped:  # last, where the eye lands: the figures above are from part of the run
        console.print(f"[bold yellow]{escape(report.stopped)}[/bold yellow]", soft_wrap=True)


def _figures_row(label: str, s: Summary, bold: bool = False) -> list[str]:
    row = [
        escape(label),  # a task's name is the prompts file's: shown as written
        f"{s.baseline.tokens}/{s.speculative.tokens}",
        spread_text(s.baseline.wall_tokens_per_second),
        spread_text(s.speculative.wall_tokens_per_second),
        spread_text(s.speedup, 2, "×"),
        number(s.acceptance_rate),
        number(s.alpha),
        number(s.tokens_per_target_decode),
        number(s.mean_draft_length),
        "n/a" if s.prediction_not_applicable else number(s.predicted.speedup if s.predicted else None, 2, "×"),
        "n/a" if s.prediction_not_applicable else number(s.efficiency),
    ]
    return [f"[bold]{cell}[/bold]" for cell in row] if bold else row


def _figures_table(title: str, first: str, rows: Sequence[list[str]], section_before_last: bool = False) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column(first, justify="left", no_wrap=True)
    for name, justify in _COLUMNS:
        table.add_column(name, justify=justify)
    for index, row in enumerate(rows):
        if section_before_last and index == len(rows) - 1:
            table.add_section()
        table.add_row(*row)
    return table


def _title(result: ConfigResult) -> str:
    return f"{result.spec}, K = {result.k}"


def render_single(result: ConfigResult, console: Console) -> None:
    rows = [_figures_row(task.task, task) for task in result.tasks]
    rows.append(_figures_row("overall", result.overall, bold=True))
    console.print(_figures_table(f"{_title(result)}  (A = target only, B = speculative)", "task", rows, section_before_last=True))
    render_details(result, console)


def _split_text(split: TimeSplit, with_draft: bool) -> str:
    parts = []
    if with_draft:
        catch_up = f" (catch-up {split.catch_up_fraction:.0%})" if split.catch_up_seconds else ""
        parts.append(f"draft {split.draft_fraction:.0%}{catch_up}")
        if split.draft_prompt_seconds:
            parts.append(f"+ draft's prompt {split.draft_prompt_fraction:.0%}")
    parts += [f"target {split.target_fraction:.0%}", f"other {split.other_fraction:.0%}"]
    parts.append(f"between steps {split.between_steps_fraction:.0%}")
    if split.host_us_per_row is not None:
        parts.append(f"host {split.host_us_per_row:.0f} µs/row, {split.host_us_per_step:.0f} µs/step")
    return " · ".join(parts)


def draft_lengths_text(summary: Summary) -> str:
    """The K chosen, compactly: 'mean 3.10 · 0×12 2×3 4×40' (steps by tokens drafted)."""
    histogram = " ".join(f"{length}×{steps}" for length, steps in summary.draft_lengths.items())
    return f"mean {number(summary.mean_draft_length)} · {histogram or 'no steps'}"


def by_source_text(summary: Summary) -> str:
    if not summary.by_source:
        return "nothing drafted"
    return " · ".join(
        f"{s.source} {number(s.acceptance_rate)} ({s.accepted}/{s.drafted} kept in {counted(s.steps, 'step')}"
        f"{f', {s.took_over} of them taking a draft over' if s.took_over else ''}, α {number(s.alpha)})"
        for s in summary.by_source
    )


def render_details(result: ConfigResult, console: Console) -> None:
    overall = result.overall
    positions = "  ".join(f"{i + 1}: {number(a)}" for i, a in enumerate(overall.per_position_acceptance))
    console.print(f"  per-position acceptance ({result.label}): {positions or '–'}")
    console.print(f"  acceptance by source: {by_source_text(overall)}")
    console.print(f"  K chosen (tokens drafted per target decode × steps): {draft_lengths_text(overall)}")
    console.print(
        f"  accepted draft tokens per target decode: {number(overall.accepted_per_target_decode)} "
        f"(+1 correction/bonus = {number(overall.tokens_per_target_decode)} tokens per target decode)"
    )
    console.print(
        f"  decode time, speculative: {_split_text(overall.speculative.time_split, True)}   "
        f"target only: {_split_text(overall.baseline.time_split, False)}"
    )
    observed = overall.observed_costs
    if observed:
        predicted = (
            f"prediction n/a ({overall.prediction_not_applicable})" if overall.prediction_not_applicable
            else f"predicted {number(observed.predicted_speedup, 2, '×')}"
        )
        console.print(
            f"  in-run costs (from the runs' own draft/target times): c = {observed.c:.3f}, verify / 1-token "
            f"decode = {observed.verify_relative_to_1_token:.2f} → {predicted}"
        )
    elif overall.prediction_not_applicable:
        console.print(f"  prediction n/a: {overall.prediction_not_applicable}")


def render_sweep(
    results: Sequence[ConfigResult], best: Best | None, measurements: Sequence[Measurement], console: Console
) -> None:
    rows = [_figures_row(r.label, r.overall, bold=best is not None and r.label == best.label) for r in results]
    console.print(_figures_table("overall, by configuration  (A = target only, B = speculative)", "configuration", rows))
    console.print(render_task_table(results, target_spread_by_task(measurements)))
    console.print(render_chart(results))
    if best:
        console.print(f"[bold green]best: {escape(best.label)}[/bold green]: {escape(best.reason)}")
        render_details(next(r for r in results if r.label == best.label), console)
    for result in results:
        if best is None or result.label != best.label:
            console.print(
                f"  {result.label}: K chosen {draft_lengths_text(result.overall)}; by source: {by_source_text(result.overall)}"
            )


def render_task_table(results: Sequence[ConfigResult], target_spread: dict[str, float]) -> Table:
    """Median speedup by task and configuration, which configuration wins each task, and how much the
    target alone's own speed moved between that task's runs: the noise its speedups carry here."""
    tasks = Table(title="speedup by task and configuration (median)", title_justify="left", header_style="bold")
    tasks.add_column("task")
    for result in results:
        tasks.add_column(result.label, justify="right")
    tasks.add_column("fastest", justify="left")
    tasks.add_column("target alone ±", justify="right")
    for i, task in enumerate(results[0].tasks):
        speedups = [r.tasks[i].speedup.median if r.tasks[i].speedup else None for r in results]
        scored = [(s, r.label) for s, r in zip(speedups, results) if s is not None]
        winner = max(scored)[1] if scored else "–"
        if scored and max(scored)[0] < 1:
            winner = "target alone"
        spread = target_spread.get(task.task)
        tasks.add_row(escape(task.task), *(number(s, 2, "×") for s in speedups), winner, "–" if spread is None else f"±{spread:.0%}")
    return tasks


def target_spread_by_task(measurements: Sequence[Measurement]) -> dict[str, float]:
    """Per task, half the range of the target alone's tok/s over the runs of each of its prompts,
    relative to their median (the median over its prompts); tasks measured once are left out."""
    speeds: dict[tuple[str, int], list[float]] = {}
    for m in measurements:
        if m.mode == "target":
            speeds.setdefault((m.task, m.prompt_index), []).append(m.wall_tokens_per_second)
    by_task: dict[str, list[float]] = {}
    for (task, _), values in speeds.items():
        median = statistics.median(values)
        if len(values) > 1 and median > 0:
            by_task.setdefault(task, []).append((max(values) - min(values)) / 2 / median)
    return {task: statistics.median(spreads) for task, spreads in by_task.items()}


def render_chart(results: Sequence[ConfigResult], width: int = 40) -> str:
    """Speedup (█ measured, ┆ at the predicted value) and acceptance (▒) by configuration, as text bars."""
    speedups = [r.overall.speedup.median if r.overall.speedup else 0.0 for r in results]
    predicted = [r.overall.predicted.speedup if r.overall.predicted else 0.0 for r in results]
    top = max([*speedups, *predicted, 1.0])
    name_width = max(len(r.label) for r in results) + 1
    lines = [f"speedup by configuration  (█ measured, ┆ predicted, │ = 1.0× past a shorter bar; scale 0–{top:.2f}×)"]
    one = round(width / top)
    for result, s, p in zip(results, speedups, predicted):
        filled = round(s / top * width)
        if s < 1.0:  # rounding must not carry a bar below 1.0× over the 1.0× mark
            filled = min(filled, one - 1)
        bar = list("█" * filled + " " * width)[:width]
        if p:
            bar[min(round(p / top * width), width) - 1] = "┆"
        if 0 < one <= width and bar[one - 1] == " ":
            bar[one - 1] = "│"
        prediction = f"(pred. {p:.2f}×)" if p else "(pred. n/a)"
        lines.append(f"{result.label:<{name_width}}{''.join(bar)} {s:.2f}×  {prediction}")
    lines.append("acceptance rate by configuration  (▒, scale 0–1)")
    for result in results:
        rate = result.overall.acceptance_rate or 0.0
        lines.append(f"{result.label:<{name_width}}{'▒' * round(rate * width):<{width}} {rate:.2f}")
    return "\n".join(lines)


def render_check(check: GreedyCheck, console: Console) -> None:
    if not check.applies:
        console.print("  text check: sampling run (matched seeds); equal text is not expected, so none is checked")
        return
    if check.status == "passed":
        console.print(f"  greedy check: [green]{check.identical}/{check.checked} speculative outputs identical to the target's own[/green]")
        return
    for parting in check.partings:
        where = (
            f"{parting.task} (prompt {parting.prompt_index}, run {parting.run}, {parting.spec} K={parting.k}, "
            f"tolerance at {parting.verify_rows}-token verify)"
        )
        label, style = ("near-tie parting", "yellow") if parting.near_tie else ("PARTING (not a near-tie)", "bold red")
        console.print(f"  [{style}]{label}[/{style}] {escape(where)}: {escape(parting.description)}")
    summary = f"{check.identical}/{check.checked} identical, {len(check.partings)} parted"
    if check.status == "failed":
        console.print(f"[bold red]greedy check FAILED: {summary}; speculative output is not the target's own. This is a bug.[/bold red]")
    else:
        console.print(f"  greedy check: [yellow]{summary}, none where the target's top two logits are clearly apart (allowed)[/yellow]")
