"""The `speccli` command line: thin commands over the engine, registry and vocabulary check."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import click
import typer
from typer.core import TyperGroup

from speccli import __version__
from speccli.errors import SpeccliError


class OneLineError(click.ClickException):
    """A SpeccliError as click shows it: one line on stderr and the error's own exit code."""

    def __init__(self, error: SpeccliError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)


class SpeccliGroup(TyperGroup):
    """Maps every known error to one line in one place; `--debug` or SPECCLI_DEBUG=1 shows the traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpeccliError as error:
            if os.environ.get("SPECCLI_DEBUG"):
                raise
            raise OneLineError(error) from None


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


def main() -> None:
    app(prog_name="speccli")
