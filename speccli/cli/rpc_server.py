"""`speccli rpc-server`: this machine's devices served to speccli or llama.cpp clients (`--rpc`)."""
from __future__ import annotations

import errno
import os
import socket
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from speccli import validation
from speccli.cli.options import checked, given_path
from speccli.errors import SpeccliError, UnreadableFileError

LOOPBACK = "127.0.0.1"


def rpc_server(
    host: Annotated[str, typer.Option("--host", "-H", help="Address to listen on; anything but 127.0.0.1 opens "
                                      "this machine to its network (the RPC protocol has no authentication).")] = LOOPBACK,
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on; 0 picks a free one (printed).")] = validation.RPC_PORT,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", help="CPU threads for the CPU device (default: all cores).",
                                                   callback=checked(validation.check_threads))] = None,
    device: Annotated[Optional[str], typer.Option("--device", "-d", metavar="DEV[,DEV...]",
                                                  help="Devices to serve, by name (see `speccli env`; default: every "
                                                  "GPU here, else the CPU).")] = None,
    cache: Annotated[Optional[Path], typer.Option("--cache", "-c", metavar="DIR", parser=given_path("a folder"),
                                                  help="Keep large tensors here, so "
                                                  "that a client's next load of the same model skips sending them.")] = None,
) -> None:
    """Serve this machine's devices to a speccli (or llama.cpp) client that runs the target with --rpc."""
    from speccli.llama import rpc

    validation.check_listen(host, port)
    address = _ipv4_address(host)
    served = rpc.serving_devices(_device_names(device))
    if cache is not None:
        if cache.exists() and not cache.is_dir():
            raise UnreadableFileError(f"--cache {cache}: a file, not a folder")
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SpeccliError(f"--cache {cache}: cannot create it ({error.strerror or error})") from None
    port = _bindable_port(address, port)
    threads = threads or os.cpu_count() or 1
    server = threading.Thread(target=rpc.server(address, port, served, threads, cache), daemon=True)
    server.start()
    while server.is_alive() and _free(address, port):  # announced once a client can connect
        time.sleep(0.02)
    if server.is_alive() and address != LOOPBACK:  # before the line that says it serves, which scripts wait for
        typer.echo(f"warning: the RPC protocol has no authentication: anyone who can reach {address}:{port} can use "
                   "this machine's devices and memory; keep it on a private network or behind an SSH tunnel "
                   "(docs/rpc.md)", err=True)
    if server.is_alive():
        names = ", ".join(f"{d.name} ({d.description}, {d.total_bytes // 2**20} MiB)" for d in served)
        typer.echo(f"speccli rpc-server: serving {names} on {address}:{port} with {threads} threads"
                   f"{f', tensor cache {cache}' if cache else ''}; Ctrl-C stops it")
    while server.is_alive():  # the server never returns; Ctrl-C and SIGTERM end this wait (130, 143)
        server.join(timeout=0.2)
    raise SpeccliError(f"the RPC server on {address}:{port} stopped: llama.cpp could not start it (see above)")


def _ipv4_address(host: str) -> str:
    """llama.cpp's server binds IPv4 addresses only: a name is resolved to one here."""
    if ":" in host:
        raise SpeccliError(f"--host {host!r}: an IPv6 address; llama.cpp's RPC server listens on IPv4 addresses only")
    try:
        return socket.gethostbyname(host)
    except (OSError, UnicodeError):
        raise SpeccliError(f"--host {host!r}: not an IPv4 address or a host name this machine can resolve") from None


def _device_names(device: str | None) -> list[str]:
    """--device's names, each once; none given: [] (the default devices). An empty name is refused, not
    skipped: `--device ''` from an unset variable had served the default devices without a word."""
    if device is None:
        return []
    names = [name.strip() for name in device.split(",")]
    if not all(names):
        raise SpeccliError(f"--device {device!r}: a device name is empty; `speccli env` lists them")
    lowered = [name.lower() for name in names]  # as devices are matched
    if again := [name for i, name in enumerate(names) if lowered[i] in lowered[:i]]:
        raise SpeccliError(f"--device {device!r}: {again[0]} is named twice")
    return names


def _free(address: str, port: int) -> bool:
    """Whether nothing listens on address:port yet (a bind with SO_REUSEADDR fails only on a listener)."""
    try:
        return _bindable_port(address, port) == port
    except SpeccliError:
        return False


def _bindable_port(address: str, port: int) -> int:
    """`port`, once shown free on `address` (0: a free one), as llama.cpp's server binds it (SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            reason = {errno.EADDRINUSE: "the port is in use", errno.EADDRNOTAVAIL: "not an address of this machine"}.get(
                error.errno, error.strerror or str(error))
            raise SpeccliError(f"--host {address} --port {port}: cannot listen there ({reason})") from None
        return probe.getsockname()[1]
