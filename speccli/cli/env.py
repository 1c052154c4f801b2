"""`speccli env`: versions, the llama.cpp backend in use, and whether GPU offload is supported."""
from __future__ import annotations

import sys

import typer

from speccli import __version__


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
