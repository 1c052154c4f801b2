"""The human-readable bench report: rich tables, text and a text chart, each a pure function of the
typed report (nothing here measures or reads files)."""
from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speccli.bench.report import BenchReport, BestK, GreedyCheck, KResult, Spread, Summary, TimeSplit
from speccli.util.format import format_size

_COLUMNS = (
    ("tokens\nA/B", "right"),
    ("target-only\ntok/s", "right"),
    ("speculative\ntok/s", "right"),
    ("speedup", "right"),
    ("accept\nrate", "right"),
    ("α\n(est.)", "right"),
    ("tok/\nverify", "right"),
    ("predicted\nspeedup", "right"),
    ("effi-\nciency", "right"),
)


def number(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def spread_text(s: Spread | None, digits: int = 1, suffix: str = "") -> str:
    if not s:
        return "–"
    return f"{s.median:.{digits}f}{suffix} [dim]({s.min:.{digits}f}–{s.max:.{digits}f})[/dim]"


def render_report(report: BenchReport, console: Console) -> None:
    settings, env, models, costs = report.settings, report.environment, report.models, report.costs
    mode = "greedy" if settings.greedy else f"temperature {settings.temperature:g}, seed {settings.seed}"
    pair = f"pair {escape(models.pair)}" if models.pair else "ad-hoc pair"
    console.print(
        f"[bold]speccli bench[/bold] · {pair} · K={','.join(map(str, settings.k))} · {mode} · "
        f"{settings.n_predict} new tokens max · {settings.runs} run(s) + {settings.warmup} warm-up · "
        f"{report.prompts.count} prompt(s) ({escape(report.prompts.source)})"
    )
    console.print(f"  [dim]{escape(report.command)}[/dim]", soft_wrap=True)
    for role, model in (("target", models.target), ("draft", models.draft)):
        console.print(f"  {role:<6} {escape(model.name)} ({format_size(model.size_bytes)}, sha256 {model.sha256[:12]})")
    offload = f"ngl {env.target_n_gpu_layers}/{env.draft_n_gpu_layers}" if env.gpu_offload_supported else "no GPU offload"
    console.print(f"  {env.backend} · {env.threads} threads · {offload} · llama-cpp-python {env.llama_cpp_python}")
    verify = ", ".join(f"K={v.k}: {v.relative_to_1_token:.2f}" for v in costs.verify)
    console.print(
        f"  profiled: target 1-token decode {costs.target_decode_1_seconds * 1e3:.1f} ms, draft "
        f"{costs.draft_decode_1_seconds * 1e3:.1f} ms → c = {costs.c:.3f}; "
        f"(K+1)-token verify / 1-token decode: {verify}"
    )
    if len(report.results) == 1:
        render_single(report.results[0], console)
    else:
        render_sweep(report.results, report.best_k, console)
    console.print(
        "[dim]tok/s: decode phase, wall-clock, median (min–max) over runs; speedup: median of per-round ratios. "
        "tok/verify counts the target's correction/bonus token. "
        "predicted = (1−α^(K+1))/(1−α) ÷ (K·c + v(K+1)) from measured α, c, v — a prediction, not a measurement; "
        "efficiency = measured ÷ predicted.[/dim]"
    )
    render_check(report.greedy_check, console)


def _figures_row(label: str, s: Summary, bold: bool = False) -> list[str]:
    row = [
        label,
        f"{s.baseline.tokens}/{s.speculative.tokens}",
        spread_text(s.baseline.wall_tokens_per_second),
        spread_text(s.speculative.wall_tokens_per_second),
        spread_text(s.speedup, 2, "×"),
        number(s.acceptance_rate),
        number(s.alpha),
        number(s.tokens_per_target_decode),
        number(s.predicted.speedup if s.predicted else None, 2, "×"),
        number(s.efficiency),
    ]
    return [f"[bold]{cell}[/bold]" for cell in row] if bold else row


def _figures_table(title: str, first: str, rows: Sequence[list[str]], section_before_last: bool = False) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column(first, justify="left")
    for name, justify in _COLUMNS:
        table.add_column(name, justify=justify)
    for index, row in enumerate(rows):
        if section_before_last and index == len(rows) - 1:
            table.add_section()
        table.add_row(*row)
    return table


def render_single(result: KResult, console: Console) -> None:
    rows = [_figures_row(task.task, task) for task in result.tasks]
    rows.append(_figures_row("overall", result.overall, bold=True))
    console.print(_figures_table(f"K = {result.k}  (A = target only, B = speculative)", "task", rows, section_before_last=True))
    render_details(result, console)


def _split_text(split: TimeSplit, with_draft: bool) -> str:
    parts = [("draft", split.draft_fraction)] if with_draft else []
    parts += [("target", split.target_fraction), ("other", split.other_fraction), ("between steps", split.between_steps_fraction)]
    return " · ".join(f"{name} {share:.0%}" for name, share in parts)


def render_details(result: KResult, console: Console) -> None:
    overall = result.overall
    positions = "  ".join(f"{i + 1}: {number(a)}" for i, a in enumerate(overall.per_position_acceptance))
    console.print(f"  per-position acceptance (K={result.k}): {positions}")
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
        console.print(
            f"  in-run costs (from the runs' own draft/target times): c = {observed.c:.3f}, verify / 1-token "
            f"decode = {observed.verify_relative_to_1_token:.2f} → predicted {number(observed.predicted_speedup, 2, '×')}"
        )


def render_sweep(results: Sequence[KResult], best: BestK | None, console: Console) -> None:
    rows = [_figures_row(str(r.k), r.overall, bold=best is not None and r.k == best.k) for r in results]
    console.print(_figures_table("overall, by K  (A = target only, B = speculative)", "K", rows))
    tasks = Table(title="speedup by task and K (median)", title_justify="left", header_style="bold")
    tasks.add_column("task")
    for result in results:
        tasks.add_column(f"K={result.k}", justify="right")
    for i, task in enumerate(results[0].tasks):
        tasks.add_row(task.task, *(number(r.tasks[i].speedup.median if r.tasks[i].speedup else None, 2, "×") for r in results))
    console.print(tasks)
    console.print(render_chart(results))
    if best:
        console.print(f"[bold green]best K = {best.k}[/bold green]: {best.reason}")
        render_details(next(r for r in results if r.k == best.k), console)


def render_chart(results: Sequence[KResult], width: int = 40) -> str:
    """Speedup (█ measured, ┆ at the predicted value) and acceptance (▒) against K, as text bars."""
    speedups = [r.overall.speedup.median if r.overall.speedup else 0.0 for r in results]
    predicted = [r.overall.predicted.speedup if r.overall.predicted else 0.0 for r in results]
    top = max([*speedups, *predicted, 1.0])
    lines = [f"speedup against K  (█ measured, ┆ predicted, │ = 1.0×; scale 0–{top:.2f}×)"]
    one = round(width / top)
    for result, s, p in zip(results, speedups, predicted):
        bar = list("█" * round(s / top * width) + " " * width)[:width]
        if p:
            bar[min(round(p / top * width), width) - 1] = "┆"
        if 0 < one <= width and bar[one - 1] == " ":
            bar[one - 1] = "│"
        lines.append(f"K={result.k:<3}{''.join(bar)} {s:.2f}×  (pred. {p:.2f}×)")
    lines.append("acceptance rate against K  (▒, scale 0–1)")
    for result in results:
        rate = result.overall.acceptance_rate or 0.0
        lines.append(f"K={result.k:<3}{'▒' * round(rate * width):<{width}} {rate:.2f}")
    return "\n".join(lines)


def render_check(check: GreedyCheck, console: Console) -> None:
    if not check.applies:
        console.print("  text check: sampling run (matched seeds); equal text is not expected, so none is checked")
        return
    if check.status == "passed":
        console.print(f"  greedy check: [green]{check.identical}/{check.checked} speculative outputs identical to the target's own[/green]")
        return
    for parting in check.partings:
        where = f"{parting.task} (prompt {parting.prompt_index}, run {parting.run}, K={parting.k})"
        label, style = ("near-tie parting", "yellow") if parting.near_tie else ("PARTING (not a near-tie)", "bold red")
        console.print(f"  [{style}]{label}[/{style}] {escape(where)}: {escape(parting.description)}")
    summary = f"{check.identical}/{check.checked} identical, {len(check.partings)} parted"
    if check.status == "failed":
        console.print(f"[bold red]greedy check FAILED: {summary}; speculative output is not the target's own. This is a bug.[/bold red]")
    else:
        console.print(f"  greedy check: [yellow]{summary}, none where the target's top two logits are clearly apart (allowed)[/yellow]")
