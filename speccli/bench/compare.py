"""`speccli bench --compare A.json B.json`: two reports side by side, configuration by configuration
(draft source and K), and what differs between the runs (models, prompts, settings, environment). Both
files are validated first (`files.load_report`), which refuses older schema versions in one line."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speccli.bench.files import load_report
from speccli.bench.render import number
from speccli.bench.report import BenchReport, Summary

_IDENTITY: tuple[tuple[str, Callable[[BenchReport], object]], ...] = (
    ("target sha256", lambda r: r.models.target.sha256[:12]),
    ("draft sha256", lambda r: r.models.draft.sha256[:12] if r.models.draft else "none"),
    ("prompt set", lambda r: r.prompts.sha256[:12]),
    ("temperature", lambda r: r.settings.temperature),
    ("top-k/top-p/min-p", lambda r: (r.settings.top_k, r.settings.top_p, r.settings.min_p)),
    ("n_predict", lambda r: r.settings.n_predict),
    ("--spec", lambda r: ",".join(r.settings.spec)),
    ("--k", lambda r: ",".join(map(str, r.settings.k))),
    ("runs/warm-up", lambda r: (r.settings.runs, r.settings.warmup)),
    ("stopped", lambda r: r.stopped or "ran to its end"),  # a stopped run's figures cover fewer tasks
    ("seed", lambda r: r.settings.seed),
    ("n_ctx", lambda r: r.settings.n_ctx),
    ("backend", lambda r: r.environment.backend),
    ("GPU layers (target/draft)", lambda r: (r.environment.target_n_gpu_layers, r.environment.draft_n_gpu_layers)),
    ("threads", lambda r: r.environment.threads),
    ("cores", lambda r: r.environment.cpu_count),
    ("platform", lambda r: r.environment.platform),
    ("CPU features", lambda r: r.environment.system_info),
    ("speccli", lambda r: r.environment.speccli),
    ("llama-cpp-python", lambda r: r.environment.llama_cpp_python),
)

_FIGURES: tuple[tuple[str, Callable[[Summary], float | None], int], ...] = (
    ("speculative tok/s A → B", lambda s: s.speculative.wall_tokens_per_second and s.speculative.wall_tokens_per_second.median, 1),
    ("target-only tok/s A → B", lambda s: s.baseline.wall_tokens_per_second and s.baseline.wall_tokens_per_second.median, 1),
    ("speedup A → B", lambda s: s.speedup and s.speedup.median, 2),
    ("acceptance A → B", lambda s: s.acceptance_rate, 2),
    ("mean K chosen A → B", lambda s: s.mean_draft_length, 2),
    ("efficiency A → B", lambda s: s.efficiency, 2),
)


def differences(a: BenchReport, b: BenchReport) -> list[str]:
    """What differs between the two runs' models, prompts, settings and environment."""
    return [f"{label}: {_shown(get(a))} → {_shown(get(b))}" for label, get in _IDENTITY if get(a) != get(b)]


def _shown(value: object) -> str:
    """A setting as the labels name it: '-1/none' for (target, draft) pairs, not Python's '(-1, None)'."""
    if isinstance(value, tuple):
        return "/".join(_shown(part) for part in value)
    return "none" if value is None else str(value)


def render_comparison(a: BenchReport, b: BenchReport, names: tuple[str, str], console: Console) -> None:
    console.print(f"[bold]A[/bold] = {escape(names[0])} ({a.created})   [bold]B[/bold] = {escape(names[1])} ({b.created})")
    differ = differences(a, b)
    console.print("  differs: " + (escape("; ".join(differ)) if differ else "nothing in models, prompts, settings or environment"))
    by_label_a = {r.label: r.overall for r in a.results}
    by_label_b = {r.label: r.overall for r in b.results}
    table = Table(header_style="bold")
    table.add_column("configuration", justify="left")
    for name, _, _ in _FIGURES:
        table.add_column(name, justify="right")
    for label in dict.fromkeys([*by_label_a, *by_label_b]):
        left, right = by_label_a.get(label), by_label_b.get(label)
        cells = [
            f"{number(get(left) if left else None, digits)} → {number(get(right) if right else None, digits)}"
            for _, get, digits in _FIGURES
        ]
        table.add_row(label, *cells)
    console.print(table)


def compare_command(first: Path, second: Path, console: Console) -> None:
    a, b = load_report(first), load_report(second)
    render_comparison(a, b, (str(first), str(second)), console)
