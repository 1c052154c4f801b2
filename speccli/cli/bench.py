"""`speccli bench`: options -> a bench request -> `speccli.bench.command`. (The body is the bench
package's; this module owns the options and their checks.)"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from speccli.cli.options import (
    ConfigOption, ContextOption, DraftGpuLayersOption, DraftOption, PairArgument, TargetGpuLayersOption, TargetOption,
    TemperatureOption, ThreadsOption, checked, kept_as_typed,
)
from speccli.settings import check_seed, parse_k_sweep


def bench(
    pair: PairArgument = None,
    k: Annotated[
        Optional[str],
        typer.Option(
            "--k",
            help="Draft tokens per step: 4, or a sweep: a list 1,2,4,8 or a range 1-8 (default: the pair's k).",
            callback=checked(kept_as_typed(parse_k_sweep)),
        ),
    ] = None,
    target: TargetOption = None,
    draft: DraftOption = None,
    n_predict: Annotated[int, typer.Option("--n-predict", "-n", help="New tokens per generation (fewer if the model ends).")] = 64,
    temperature: TemperatureOption = 0.0,
    seed: Annotated[
        int,
        typer.Option(
            "--seed", "-s", help="Seed; both sides of a run share it (-1: a random one, shown in the report).",
            callback=checked(check_seed),
        ),
    ] = 42,
    runs: Annotated[int, typer.Option("--runs", help="Measured runs per prompt.")] = 2,
    warmup: Annotated[int, typer.Option("--warmup", help="Unmeasured warm-up runs first.")] = 1,
    prompts: Annotated[
        Optional[Path],
        typer.Option("--prompts", help='Prompt file: JSONL {"task": ..., "prompt": ...} or one prompt per line (default: built-in set).'),
    ] = None,
    json_path: Annotated[
        Optional[Path],
        typer.Option("--json", help="Also write every figure and the environment to this JSON file ('-': the JSON on stdout, the report on stderr)."),
    ] = None,
    compare: Annotated[
        Optional[tuple[Path, Path]], typer.Option("--compare", help="Compare two --json reports (A.json B.json) and exit.")
    ] = None,
    schema: Annotated[bool, typer.Option("--schema", help="Print the JSON Schema of the --json report and exit.")] = False,
    ctx: ContextOption = 2048,
    threads: ThreadsOption = None,
    ngl: TargetGpuLayersOption = None,
    ngl_draft: DraftGpuLayersOption = None,
    config: ConfigOption = None,
) -> None:
    """Measure speculative decoding against the target alone: tokens/s, speedup, acceptance, efficiency."""
    import json

    from speccli.bench.command import console, run_command
    from speccli.bench.compare import compare_command
    from speccli.bench.report import report_schema
    from speccli.bench.settings import BenchRequest, BenchSettings
    from speccli.models.pair import PairRequest

    if schema:
        typer.echo(json.dumps(report_schema(), indent=2))
        return
    if compare:
        compare_command(*compare, console())
        return
    pair_request = PairRequest(
        pair=pair, target=target, draft=draft, config=config, n_ctx=ctx, n_threads=threads,
        target_n_gpu_layers=ngl, draft_n_gpu_layers=ngl_draft,
    )
    settings = BenchSettings(n_predict=n_predict, temperature=temperature, seed=seed, runs=runs, warmup=warmup)
    run_command(BenchRequest(pair=pair_request, k_spec=k, settings=settings, prompts_file=prompts, json_path=json_path))
