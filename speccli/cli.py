"""The `speccli` command line: thin commands over the engine, registry and vocabulary check."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from speccli import __version__
from speccli.errors import SpeccliError


class SpeccliGroup(TyperGroup):
    """Maps every known error to one line in one place; `--debug` or SPECCLI_DEBUG=1 shows the traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpeccliError as error:
            if os.environ.get("SPECCLI_DEBUG"):
                raise
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(error.exit_code) from None


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
        from speccli.backend import backend_info

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
    from speccli.backend import backend_info

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

    from speccli.registry import load_registry, registry_tables

    Console().print(registry_tables(load_registry(config)))


@app.command()
def pull(
    names: Annotated[list[str], typer.Argument(help="Model or pair names (a pair pulls its target and draft).")],
    config: ConfigOption = None,
) -> None:
    """Download or build models into the local caches, with progress; prints each model's file."""
    from speccli.registry import load_registry, pull_models

    for name, path in pull_models(load_registry(config), names):
        typer.echo(f"{name}: {path}")


@app.command("check-vocab")
def check_vocab(
    draft: Annotated[str, typer.Argument(help="Draft model: a GGUF file.")],
    target: Annotated[str, typer.Argument(help="Target model: a GGUF file.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check that DRAFT can draft for TARGET: same token ids, same tokenization. Reads no weights.

    Exit codes: 0 identical or compatible, 1 incompatible, 2 a file could not be read.
    """
    from rich.console import Console
    from rich.text import Text

    from speccli.vocab import Verdict, check_pair

    # The one place model names will resolve to files once the registry offers it; paths for now.
    draft_path, target_path = Path(draft), Path(target)
    report = check_pair(draft_path, target_path)
    if json_output:
        typer.echo(report.to_json())
    else:
        text = Text(report.explain())
        verdict_style = {Verdict.IDENTICAL: "bold green", Verdict.COMPATIBLE: "green", Verdict.INCOMPATIBLE: "bold red"}
        text.highlight_regex(r"(?m)^verdict: .*$", verdict_style[report.verdict])
        Console(highlight=False, soft_wrap=True).print(text)
    raise typer.Exit(report.exit_code)


def main() -> None:
    app(prog_name="speccli")
