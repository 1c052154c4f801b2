"""`speccli quant-check`: how faithful quantized files are to a reference, as speculative acceptance."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from speccli.cli.options import (
    ConfigOption, ContextOption, MinPOption, ThreadsOption, TopKOption, TopPOption, checked, given_path, rpc_option,
)
from speccli.validation import check_temperature


def quant_check(
    reference: Annotated[str, typer.Argument(metavar="REFERENCE", help="Reference model (e.g. the F32/F16 file): registry name or GGUF path.")],
    candidates: Annotated[list[str], typer.Argument(metavar="CANDIDATE", help="Candidate models (quants of it): registry names or GGUF paths.")],
    text_file: Annotated[Optional[Path], typer.Option("--text", metavar="FILE", parser=given_path("a text file"), help="Compare over this text file instead of the built-in mix.")] = None,
    prompts_file: Annotated[
        Optional[Path], typer.Option("--prompts", metavar="FILE", parser=given_path("a prompt file"), help="Compare over these prompts (JSON lines with \"prompt\" or \"text\", or one per line).")
    ] = None,
    temperature: Annotated[
        float, typer.Option("--temp", help="Sampling temperature for acceptance; 0 is greedy.", callback=checked(check_temperature))
    ] = 1.0,
    top_k: TopKOption = 0,
    top_p: TopPOption = 1.0,
    min_p: MinPOption = 0.0,
    sequential: Annotated[
        bool, typer.Option("--sequential", help="Load one model at a time; the reference's rows go to a temp file.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    n_ctx: ContextOption = None,
    threads: ThreadsOption = None,
    rpc: Annotated[Optional[str], rpc_option(
        "Put every model's layers on these `speccli rpc-server`s (or llama.cpp rpc-servers), split by their memory.")] = None,
    config: ConfigOption = None,
) -> None:
    """Measure how faithful quantized models are to a reference: OK / DEGRADED / BROKEN each.

    Each CANDIDATE is compared with REFERENCE over the same text: acceptance Σmin(p,q), top-1, KL.

    Exit codes: 0 all OK or DEGRADED, 1 any BROKEN, 2 any refusal (a file unreadable, another vocabulary, a typo).
    """
    from rich.console import Console

    from speccli.checks.command import run_quant_check
    from speccli.checks.corpus import builtin_source, prompts_file_source, text_file_source
    from speccli.checks.render import render
    from speccli.core.sampling import SamplingParams
    from speccli.errors import SpeccliError

    if text_file and prompts_file:
        raise SpeccliError("give --text or --prompts, not both")
    source = text_file_source(text_file) if text_file else prompts_file_source(prompts_file) if prompts_file else builtin_source()
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    report = run_quant_check(
        reference, candidates, source, params, sequential=sequential, n_ctx=n_ctx, threads=threads, config=tuple(config or ()),
        rpc=rpc or (),
    )
    if json_output:
        typer.echo(report.to_json())
    else:
        out = Console()
        Console(width=max(out.width, 120) if not out.is_terminal else None).print(render(report))
    raise typer.Exit(report.exit_code)
