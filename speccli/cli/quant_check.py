"""`speccli quant-check`: how faithful quantized files are to a reference, as speculative acceptance."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from speccli.cli.options import ConfigOption, ContextOption, MinPOption, ThreadsOption, TopKOption, TopPOption, checked
from speccli.settings import BENCH_CTX, check_temperature


def quant_check(
    reference: Annotated[str, typer.Argument(help="Reference model (e.g. the F32/F16 file): registry name or GGUF path.")],
    candidates: Annotated[list[str], typer.Argument(help="Candidate models (quants of it): registry names or GGUF paths.")],
    text_file: Annotated[Optional[Path], typer.Option("--text", help="Compare over this text file instead of the built-in mix.")] = None,
    prompts_file: Annotated[
        Optional[Path], typer.Option("--prompts", help="Compare over these prompts (JSON lines with \"prompt\" or \"text\", or one per line).")
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
    config: ConfigOption = None,
) -> None:
    """Measure how faithful each CANDIDATE is to REFERENCE: expected speculative acceptance Σmin(p,q), top-1
    agreement and KL over the same text, with a verdict OK / DEGRADED / BROKEN each.

    Exit codes: 0 all OK or DEGRADED, 1 any BROKEN, 2 any refusal (a file unreadable, another vocabulary, a typo).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from speccli.checks.corpus import builtin_source, prompts_file_source, text_file_source, tokenize_source
    from speccli.checks.fidelity import TokenSequence, measure, memory_is_short
    from speccli.checks.render import render
    from speccli.checks.report import build_report
    from speccli.core.sampling import SamplingParams
    from speccli.errors import SpeccliError, UnreadableFileError
    from speccli.llama.model import LoadOptions
    from speccli.llama.tokenizer import load_vocab_only
    from speccli.models.config import load_registry
    from speccli.models.pair import fitted_context
    from speccli.models.resolve import resolve_model
    from speccli.vocab.check import check_pair
    from speccli.vocab.report import Verdict

    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    params.validate()
    if text_file and prompts_file:
        raise SpeccliError("give --text or --prompts, not both")
    source = text_file_source(text_file) if text_file else prompts_file_source(prompts_file) if prompts_file else builtin_source()
    registry = load_registry(config)
    reference_path = resolve_model(reference, registry)
    candidate_paths = [resolve_model(name, registry) for name in candidates]
    for path in candidate_paths:
        vocab = check_pair(path, reference_path)
        if vocab.verdict is Verdict.INCOMPATIBLE or vocab.draft.size != vocab.target.size:
            why = vocab.reasons[0] if vocab.reasons else f"{vocab.draft.size} tokens against {vocab.target.size}"
            raise UnreadableFileError(f"{path.name} does not share {reference_path.name}'s vocabulary: {why}")
    n_ctx = fitted_context(n_ctx, BENCH_CTX, [reference_path, *candidate_paths])
    with load_vocab_only(reference_path) as tokenizer:
        sequences = [TokenSequence(name, tokens) for name, tokens in tokenize_source(source, tokenizer, n_ctx)]
        sequential = sequential or memory_is_short(reference_path, candidate_paths)
        total = sum(len(s.tokens) for s in sequences) * (len(candidate_paths) + sequential)
        err = Console(stderr=True)
        with Progress(
            TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
            console=err, transient=True, disable=not err.is_terminal,
        ) as bar:
            task = bar.add_task("loading", total=total)
            measurement = measure(
                reference_path, candidate_paths, sequences, params, LoadOptions(n_ctx=n_ctx, n_threads=threads),
                sequential=sequential, progress=lambda what, done: bar.update(task, advance=done, description=what),
            )
        report = build_report(measurement, candidates, tokenizer, params, source.description)
    if json_output:
        typer.echo(report.to_json())
    else:
        out = Console()
        Console(width=max(out.width, 120) if not out.is_terminal else None).print(render(report))
    raise typer.Exit(report.exit_code)
