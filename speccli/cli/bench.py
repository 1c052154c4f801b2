"""`speccli bench`: options -> a bench request -> `speccli.bench.command`. (The body is the bench
package's; this module owns the options and their checks.)"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from speccli.cli.options import (
    GrammarOption, JsonSchemaOption, MinPOption, TemperatureOption, TopKOption, TopPOption, checked, given_path, grammar_spec, with_pair_options,
)
from speccli.drafting.registry import DEFAULT_SPEC, spec_help
from speccli.errors import UsageError
from speccli.drafting.registry import parse_spec_list
from speccli.validation import BENCH_CTX, check_seed, parse_k_sweep

if TYPE_CHECKING:
    from speccli.models.pair import PairRequest


@with_pair_options(default_n_ctx=BENCH_CTX)
def bench(
    context: typer.Context,
    pair_request: PairRequest,
    k: Annotated[
        Optional[str],  # text to Click; the callback hands on the parsed list of K, or None (not given)
        typer.Option(
            "--k", metavar="K",
            help="Draft tokens per step: auto (chosen per step), 4, or a sweep: a list auto,1,2,4 or a range 1-8 "
            "(default: the pair's k, else auto).",
            callback=checked(parse_k_sweep),
        ),
    ] = None,
    spec: Annotated[
        Optional[str],  # text to Click; the callback hands on the parsed list, or None (not given)
        typer.Option(
            "--spec", metavar="SOURCES",
            help=f"Draft source(s): {spec_help()}; or a list compared side by side: model,ngram,{DEFAULT_SPEC} "
            f"(default: the pair's, else {DEFAULT_SPEC}).",
            callback=checked(parse_spec_list),
        ),
    ] = None,
    n_predict: Annotated[int, typer.Option("--n-predict", "-n", help="New tokens per generation (fewer if the model ends).")] = 64,
    temperature: TemperatureOption = 0.0,
    top_k: TopKOption = 0,
    top_p: TopPOption = 1.0,
    min_p: MinPOption = 0.0,
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
        typer.Option("--prompts", metavar="FILE", parser=given_path("a prompt file"), help='Prompt file: JSONL {"task": ..., "prompt": ...} (named .jsonl, or its first line an object) or one prompt per line (default: built-in set).'),
    ] = None,
    json_path: Annotated[
        Optional[Path],
        typer.Option("--json", metavar="FILE", parser=given_path("a file name, or - for stdout"),
                     help="Also write every figure and the environment to this JSON file ('-': the JSON on stdout, the report on stderr)."),
    ] = None,
    compare: Annotated[
        Optional[tuple[Path, Path]], typer.Option("--compare", metavar="A.json B.json", parser=given_path("two --json reports"), help="Compare two --json reports (A.json B.json) and exit.")
    ] = None,
    schema: Annotated[bool, typer.Option("--schema", help="Print the JSON Schema of the --json report and exit.")] = False,
    json_schema: JsonSchemaOption = None,
    grammar: GrammarOption = None,
) -> None:
    """Measure speculative decoding against the target alone: tokens/s, speedup, acceptance, the K chosen."""
    import json

    from speccli.bench.command import console, run_command
    from speccli.bench.compare import compare_command
    from speccli.bench.report import report_schema
    from speccli.bench.settings import BenchRequest, BenchSettings
    from speccli.core.sampling import SamplingParams

    if schema:
        _alone(context, "--schema")
        typer.echo(json.dumps(report_schema(), indent=2))
        return
    if compare:
        _alone(context, "--compare")
        compare_command(*compare, console())
        return
    settings = BenchSettings(
        n_predict=n_predict, sampling=SamplingParams(temperature, top_k, top_p, min_p), seed=seed, runs=runs, warmup=warmup,
        grammar=grammar_spec(json_schema, grammar),
    )
    given = ("--json-schema", json_schema) if json_schema is not None else ("--grammar", str(grammar)) if grammar else None
    run_command(BenchRequest(
        pair=pair_request, specs=spec, ks=k, settings=settings, prompts_file=prompts, json_path=json_path, grammar_option=given
    ))


def _alone(context: typer.Context, option: str) -> None:
    """--compare and --schema measure nothing: any other option given with them would be ignored in silence
    (`--compare A B --json out.json` wrote nothing), so it is refused."""
    ignored = [
        param.opts[0] if param.opts[0].startswith("-") else f"the {param.name} argument"
        for param in context.command.params
        if param.opts[0] != option and getattr(context.get_parameter_source(param.name), "name", None) == "COMMANDLINE"
    ]
    if ignored:
        them = "it" if len(ignored) == 1 else "them"
        raise UsageError(f"{option} measures nothing, so {', '.join(ignored)} would do nothing with it; leave {them} out")
