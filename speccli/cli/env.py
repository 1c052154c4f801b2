"""`speccli env`: versions, the llama.cpp backend in use, and the devices models can run on."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from speccli import __version__
from speccli.cli.options import rpc_option


def env(
    rpc: Annotated[Optional[str], rpc_option("Also list the devices of these `speccli rpc-server`s (or llama.cpp rpc-servers).")] = None,
) -> None:
    """Show versions, the llama.cpp backend in use and the devices models can run on (RPC servers' with --rpc)."""
    from speccli.llama import rpc as rpc_backend
    from speccli.llama.build import backend_info

    rpc_backend.connect(rpc or ())  # first: a server that cannot be reached is the one line printed
    info = backend_info()
    typer.echo(f"speccli            {__version__}")
    typer.echo(f"python             {sys.version.split()[0]}")
    typer.echo(f"llama-cpp-python   {info.llama_cpp_python_version}")
    typer.echo(f"backend            {info.backend}")
    typer.echo(f"gpu offload        {info.offload}")
    typer.echo(f"rpc                {'supported' if rpc_backend.available() else 'not in this build'}")
    typer.echo(f"system info        {info.system_info}")
    typer.echo("devices")
    for device in rpc_backend.devices(memory=True):
        memory = f"{device.total_bytes / 2**30:.1f} GiB, {device.free_bytes / 2**30:.1f} GiB free"
        # ggml types every RPC device a GPU, whatever the server computes on: say RPC, not GPU.
        kind = "RPC" if device.is_rpc else device.kind
        typer.echo(f"  {device.name:<16} {kind:<6} {memory:<28} {device.description}")
