"""The `speccli` command line: thin commands over the engine, registry and vocabulary check."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from speccli import __version__
from speccli.errors import SpeccliError, UnreadableFileError


class SpeccliGroup(TyperGroup):
    """Maps every known error to one line in one place; `--debug` or SPECCLI_DEBUG=1 shows the traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # The reader went away (`speccli models | head`): nothing left to say to anyone.
            sys.stderr.close()
            raise typer.Exit(141) from None
        except (SpeccliError, OSError) as error:
            if os.environ.get("SPECCLI_DEBUG"):
                raise
            typer.echo(f"error: {_one_line(error)}", err=True)
            raise typer.Exit(getattr(error, "exit_code", 2)) from None


def _one_line(error: Exception) -> str:
    """SpeccliErrors are written for users already; an OSError (disk full, permission denied while
    writing a cache or report) gets its file and reason."""
    if isinstance(error, OSError) and not isinstance(error, SpeccliError):
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror or error}"
    return str(error)


app = typer.Typer(
    cls=SpeccliGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Faster local GGUF generation by speculative decoding, with the target model's exact output distribution.",
)

# Options shared by several commands, defined once.
ConfigOption = Annotated[
    Optional[Path],
    typer.Option("--config", help="Extra models.toml, read after the shipped and user files (overrides them)."),
]
# Generation options for chat and bench; llama.cpp's short names are accepted as aliases.
PairArgument = Annotated[Optional[str], typer.Argument(help="A pair from models.toml (default: its default_pair).")]
TargetOption = Annotated[
    Optional[str], typer.Option("--target", "-m", help="Target model: registry name or GGUF path (overrides the pair's).")
]
DraftOption = Annotated[
    Optional[str], typer.Option("--draft", "-md", help="Draft model: registry name or GGUF path (overrides the pair's).")
]
TemperatureOption = Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 is greedy.")]
TopKOption = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens; 0 keeps all.")]
TopPOption = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
MinPOption = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p times the top probability.")]
SeedOption = Annotated[Optional[int], typer.Option("--seed", "-s", help="Random seed (default: random).")]
MaxTokensOption = Annotated[int, typer.Option("--max-tokens", "-n", help="Most tokens to generate per reply.")]
ContextOption = Annotated[int, typer.Option("--ctx", "-c", help="Context window, in tokens, for both models.")]
ThreadsOption = Annotated[Optional[int], typer.Option("--threads", "-t", help="CPU threads (default: all cores).")]
TargetGpuLayersOption = Annotated[
    Optional[int], typer.Option("--ngl", "-ngl", help="Target layers on the GPU (default: the pair's, else all).")
]
DraftGpuLayersOption = Annotated[
    Optional[int], typer.Option("--ngl-draft", "-ngld", help="Draft layers on the GPU (default: the pair's, else all).")
]


def version_callback(value: bool) -> None:
    if value:
        from speccli.llama.build import backend_info

        info = backend_info()
        typer.echo(f"speccli {__version__}")
        typer.echo(f"llama-cpp-python {info.llama_cpp_python_version} ({info.summary})")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Show versions and backend.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    if debug:
        os.environ["SPECCLI_DEBUG"] = "1"


@app.command()
def env() -> None:
    """Show versions, the llama.cpp backend in use and whether GPU offload is supported."""
    from speccli.llama.build import backend_info

    info = backend_info()
    typer.echo(f"speccli            {__version__}")
    typer.echo(f"python             {sys.version.split()[0]}")
    typer.echo(f"llama-cpp-python   {info.llama_cpp_python_version}")
    typer.echo(f"backend            {info.backend}")
    typer.echo(f"gpu offload        {'supported' if info.gpu_offload else 'not supported'}")
    typer.echo(f"system info        {info.system_info}")


@app.command()
def models(config: ConfigOption = None) -> None:
    """List the named models (source, size on disk, cached or not, pairs) and the pairs."""
    from rich.console import Console

    from speccli.models.registry import load_registry, registry_tables

    Console().print(registry_tables(load_registry(config)))


@app.command()
def pull(
    names: Annotated[list[str], typer.Argument(help="Model or pair names (a pair pulls its target and draft).")],
    config: ConfigOption = None,
) -> None:
    """Download or build models into the local caches, with progress; prints each model's file."""
    from speccli.models.registry import load_registry, pull_models

    for name, path in pull_models(load_registry(config), names):
        typer.echo(f"{name}: {path}")


@app.command("check-vocab")
def check_vocab(
    draft: Annotated[str, typer.Argument(help="Draft model: registry name or GGUF path.")],
    target: Annotated[str, typer.Argument(help="Target model: registry name or GGUF path.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Check that DRAFT can draft for TARGET: same token ids, same tokenization. Reads no weights.

    Exit codes: 0 identical or compatible, 1 incompatible, 2 a model could not be found or read.
    """
    from rich.console import Console
    from rich.text import Text

    from speccli.models.registry import load_registry, resolve_model
    from speccli.vocab.check import Verdict, check_pair

    try:
        registry = load_registry(config)
        # Never downloads: a registry model must be on disk already (`speccli pull` fetches it).
        draft_path, target_path = (resolve_model(name, registry, fetch=False) for name in (draft, target))
    except SpeccliError as error:
        raise UnreadableFileError(str(error)) from None  # exit 2, so that 1 always means "incompatible"
    report = check_pair(draft_path, target_path)
    if json_output:
        typer.echo(report.to_json())
    else:
        text = Text(report.explain())
        style = {Verdict.IDENTICAL: "bold green", Verdict.COMPATIBLE: "green", Verdict.INCOMPATIBLE: "bold red"}
        text.highlight_regex(r"(?m)^verdict: .*$", style[report.verdict])
        Console(highlight=False, soft_wrap=True).print(text)
    raise typer.Exit(report.exit_code)


@app.command()
def chat(
    pair: PairArgument = None,
    target: TargetOption = None,
    draft: DraftOption = None,
    k: Annotated[Optional[int], typer.Option("--k", help="Draft tokens per target decode (default: the pair's).")] = None,
    temperature: TemperatureOption = 0.8,
    top_k: TopKOption = 40,
    top_p: TopPOption = 0.95,
    min_p: MinPOption = 0.05,
    seed: SeedOption = None,
    max_tokens: MaxTokensOption = 512,
    ctx: ContextOption = 4096,
    threads: ThreadsOption = None,
    ngl: TargetGpuLayersOption = None,
    ngl_draft: DraftGpuLayersOption = None,
    system: Annotated[Optional[str], typer.Option("--system", help="System prompt.")] = None,
    prompt: Annotated[
        Optional[str],
        typer.Option(
            "--prompt", "-p",
            help="Reply to this one message and exit; '-' reads it from stdin. Without it, piped stdin is "
            "read one turn per line (slash commands work).",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object per reply on stdout: text, finish reason, statistics.")
    ] = False,
    color_provenance: Annotated[
        bool,
        typer.Option(
            "--color-provenance/--no-color-provenance",
            help="Color tokens by origin: accepted draft, target correction, bonus.",
        ),
    ] = True,
    config: ConfigOption = None,
) -> None:
    """Chat with a pair: streamed replies colored by token origin, with live speculative-decoding statistics."""
    from speccli.chat.session import run_chat
    from speccli.core.sampling import SamplingParams
    from speccli.models.pair import PairRequest

    run_chat(
        PairRequest(pair, target, draft, config, ctx, threads, ngl, ngl_draft),
        sampling=SamplingParams(temperature, top_k, top_p, min_p),
        k=k,
        seed=seed,
        max_tokens=max_tokens,
        system=system,
        prompt=prompt,
        json_output=json_output,
        provenance=color_provenance,
    )


@app.command()
def bench(
    pair: PairArgument = None,
    k: Annotated[
        Optional[str],
        typer.Option("--k", help="Draft tokens per step: 4, or a sweep: a list 1,2,4,8 or a range 1-8 (default: the pair's k)."),
    ] = None,
    target: TargetOption = None,
    draft: DraftOption = None,
    n_predict: Annotated[int, typer.Option("--n-predict", "-n", help="New tokens per generation (fewer if the model ends).")] = 64,
    temperature: TemperatureOption = 0.0,
    seed: Annotated[int, typer.Option("--seed", "-s", help="Seed; both sides of a run share it.")] = 42,
    runs: Annotated[int, typer.Option("--runs", help="Measured runs per prompt.")] = 2,
    warmup: Annotated[int, typer.Option("--warmup", help="Unmeasured warm-up runs first.")] = 1,
    prompts: Annotated[
        Optional[Path],
        typer.Option("--prompts", help='Prompt file: JSONL {"task": ..., "prompt": ...} or one prompt per line (default: built-in set).'),
    ] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write every figure and the environment to this JSON file.")] = None,
    compare: Annotated[
        Optional[tuple[Path, Path]], typer.Option("--compare", help="Compare two --json reports (A.json B.json) and exit.")
    ] = None,
    ctx: ContextOption = 2048,
    threads: ThreadsOption = None,
    ngl: TargetGpuLayersOption = None,
    ngl_draft: DraftGpuLayersOption = None,
    config: ConfigOption = None,
) -> None:
    """Measure speculative decoding against the target alone: tokens/s, speedup, acceptance, efficiency."""
    from speccli.bench.command import BenchRequest, BenchSettings, compare_command, run_command

    if compare:
        compare_command(*compare)
        return
    settings = BenchSettings(ks=(), n_predict=n_predict, temperature=temperature, seed=seed, runs=runs, warmup=warmup)
    request = BenchRequest(
        pair=pair, target=target, draft=draft, k_spec=k, settings=settings, prompts_file=prompts, json_path=json_path,
        n_ctx=ctx, threads=threads, target_n_gpu_layers=ngl, draft_n_gpu_layers=ngl_draft, config=config,
    )
    run_command(request)


from speccli.cli.serve import serve  # noqa: E402  (registered here; the command lives in cli/serve.py)

app.command()(serve)


def main() -> None:
    app(prog_name="speccli")
