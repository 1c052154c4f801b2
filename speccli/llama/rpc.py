"""llama.cpp's RPC backend: a target's layers on other machines, and this machine's devices served to them.

A client registers each `host:port` with the RPC backend (`ggml_backend_rpc_add_server`, then
`ggml_backend_register`), which adds that server's devices to llama.cpp's device list; a model then
names the devices it may use through `llama_model_params.devices`. llama.cpp itself would give every
model every device, so once a server is registered each model's devices are always explicit: the
target gets the RPC devices first and this machine's GPUs last (the order of llama.cpp's own `--rpc`,
so the output layer and its logits stay local where a GPU is here), the draft only local devices.

ggml's RPC client aborts the process when a server fails (`GGML_ABORT`, from its dispatcher thread).
So a server is checked before anything loads (a TCP connect with a short timeout, then the protocol's
own HELLO), and a server lost later reaches `on_server_lost`'s handler through ggml's abort callback,
which must never return (ggml calls abort() after it).
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import llama_cpp

from speccli.errors import SpeccliError
from speccli.llama.log import clear_errors, init_backend, last_llama_error
from speccli.validation import Endpoint

# ggml-rpc.h of the llama.cpp that llama-cpp-python 0.3.36 vendors: RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION.
PROTOCOL = (7, 0, 0)
CONNECT_SECONDS = 3.0  # a server that has not answered by then is named, rather than waited for
_HELLO = 14  # RPC_CMD_HELLO, fixed across versions
_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: the hello request's body, and the reply's after 4 version bytes

_GGML_DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}  # enum ggml_backend_dev_type


class RpcServerError(SpeccliError):
    """An RPC server that cannot be used: unreachable, of another protocol, or lost mid-run."""


def hello(endpoint: Endpoint, timeout: float = CONNECT_SECONDS) -> tuple[int, int, int]:
    """The protocol version `endpoint` speaks, by the protocol's own first exchange; one clear line
    where it cannot be had. The connection is closed after it: a server serves one client at a time."""
    where = f"RPC server {endpoint}"
    connected = False
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as connection:
            connected = True
            connection.sendall(struct.pack("<BQ", _HELLO, _CAPS_SIZE) + bytes(_CAPS_SIZE))
            reply = _receive(connection, 8 + 4 + _CAPS_SIZE)
    except socket.gaierror:
        raise RpcServerError(f"{where}: no such host") from None
    except ConnectionRefusedError:
        raise RpcServerError(f"{where}: nothing listens there (connection refused); start one there with "
                             f"`speccli rpc-server --port {endpoint.port}`") from None
    except (socket.timeout, TimeoutError):
        if connected:  # something listens there, and says nothing
            raise RpcServerError(f"{where}: connected, but no reply to the RPC hello within {timeout:g} s: not an RPC "
                                 "server, or one busy with another client") from None
        raise RpcServerError(f"{where}: no answer within {timeout:g} s (a wrong address, a firewall, or a server "
                             "busy with another client)") from None
    except OSError as error:
        raise RpcServerError(f"{where}: cannot connect ({error.strerror or error})") from None
    if reply is None or struct.unpack_from("<Q", reply)[0] != 4 + _CAPS_SIZE:
        raise RpcServerError(f"{where}: did not answer the RPC hello of protocol {_version_text(PROTOCOL)}: not an RPC "
                             "server, or one of another llama.cpp version (use the same speccli or llama.cpp "
                             "release on both machines)")
    version = tuple(reply[8:11])
    if version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
        raise RpcServerError(f"{where} speaks RPC protocol {_version_text(version)}, this build speaks "
                             f"{_version_text(PROTOCOL)}: use the same speccli or llama.cpp release on both machines")
    return version  # type: ignore[return-value]


def _receive(connection: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _version_text(version: Sequence[int]) -> str:
    return ".".join(map(str, version))


# --- ggml's device registry, through ctypes -------------------------------------------------------------

def _ggml() -> ctypes.CDLL:
    """libggml, loaded already by libllama (its symbols include libggml-base's)."""
    global _GGML
    if _GGML is None:
        base = Path(llama_cpp.llama_cpp._base_path)
        library = ctypes.CDLL(str(base / ("ggml.dll" if sys.platform == "win32" else
                                         "libggml.dylib" if (base / "libggml.dylib").exists() else "libggml.so")))
        pointer, text, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        for name, restype, argtypes in [
            ("ggml_backend_dev_count", size, []),
            ("ggml_backend_dev_get", pointer, [size]),
            ("ggml_backend_dev_name", text, [pointer]),
            ("ggml_backend_dev_description", text, [pointer]),
            ("ggml_backend_dev_type", ctypes.c_int, [pointer]),
            ("ggml_backend_dev_memory", None, [pointer, ctypes.POINTER(size), ctypes.POINTER(size)]),
            ("ggml_backend_dev_backend_reg", pointer, [pointer]),
            ("ggml_backend_reg_name", text, [pointer]),
            ("ggml_backend_reg_by_name", pointer, [text]),
            ("ggml_backend_reg_get_proc_address", pointer, [pointer, text]),
            ("ggml_backend_register", None, [pointer]),
            ("ggml_set_abort_callback", pointer, [pointer]),
        ]:
            function = getattr(library, name)
            function.restype, function.argtypes = restype, argtypes
        _GGML = library
    return _GGML


_GGML: ctypes.CDLL | None = None
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_void_p))
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


@dataclass(frozen=True)
class Device:
    """One device llama.cpp can place layers on."""
    name: str  # "CPU", "CUDA0", "RPC0"
    description: str  # the hardware, or an RPC device's endpoint
    kind: str  # "CPU", "GPU", "IGPU" or "ACCEL"
    backend: str  # "CPU", "CUDA", "Metal", "RPC", ...
    free_bytes: int
    total_bytes: int
    handle: int

    @property
    def is_rpc(self) -> bool:
        return self.backend == "RPC"

    @property
    def is_local_accelerator(self) -> bool:
        return self.kind in ("GPU", "IGPU") and not self.is_rpc


def devices(*, memory: bool = False) -> list[Device]:
    """Every device llama.cpp knows now, RPC servers' included once connected. `memory`: ask each for
    its memory, which asks an RPC server over the network (and aborts where it is gone); else 0."""
    init_backend()
    ggml = _ggml()
    found = []
    for index in range(ggml.ggml_backend_dev_count()):
        handle = ggml.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        if memory:
            ggml.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        found.append(Device(
            name=ggml.ggml_backend_dev_name(handle).decode(errors="replace"),
            description=ggml.ggml_backend_dev_description(handle).decode(errors="replace"),
            kind=_GGML_DEVICE_TYPES.get(ggml.ggml_backend_dev_type(handle), "?"),
            backend=ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(handle)).decode(errors="replace"),
            free_bytes=free.value, total_bytes=total.value, handle=handle,
        ))
    return found


def available() -> bool:
    """Whether this build of llama.cpp has the RPC backend (GGML_RPC=ON)."""
    init_backend()
    return bool(_ggml().ggml_backend_reg_by_name(b"RPC"))


def _rpc_function(name: str, prototype: type) -> Callable:
    init_backend()
    ggml = _ggml()
    registry = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(registry, name.encode()) if registry else None
    if not address:
        raise SpeccliError("this build of llama.cpp has no RPC backend; rebuild it with `python3 .ci/setup.py` "
                           "(which turns GGML_RPC on), or set CMAKE_ARGS with -DGGML_RPC=ON")
    return prototype(address)


_connected: dict[Endpoint, list[Device]] = {}


def connect(endpoints: Sequence[Endpoint]) -> list[Device]:
    """Check each server, then add its devices to llama.cpp's: the RPC devices, in `endpoints`' order.
    Once per endpoint and process; nothing where none is named."""
    if not endpoints:
        return []
    for endpoint in endpoints:
        if endpoint not in _connected:
            hello(endpoint)
            _connected[endpoint] = _register(endpoint)
    _install_abort_callback()
    return [device for endpoint in endpoints for device in _connected[endpoint]]


def _register(endpoint: Endpoint) -> list[Device]:
    ggml = _ggml()
    try:  # ggml_backend_rpc_start_server binds an IPv4 address, and the client resolves names itself
        address = socket.gethostbyname(endpoint.host)
    except OSError:
        raise RpcServerError(f"RPC server {endpoint}: no such host") from None
    clear_errors()
    registry = _rpc_function("ggml_backend_rpc_add_server", _ADD_SERVER)(f"{address}:{endpoint.port}".encode())
    if not registry:
        raise RpcServerError(f"RPC server {endpoint} offers no device{last_llama_error()}")
    before = {device.handle for device in devices()}
    ggml.ggml_backend_register(registry)
    added = [device for device in devices() if device.handle not in before]
    return [Device(**{**device.__dict__, "description": str(endpoint)}) for device in added]


def wait_for(endpoints: Sequence[Endpoint]) -> None:
    """Return once each server has done the work sent to it: a server handles its client's commands in
    order, and the device-memory question is answered (a round trip) only after the work before it."""
    ggml, free, total = _ggml(), ctypes.c_size_t(0), ctypes.c_size_t(0)
    for endpoint in endpoints:
        ggml.ggml_backend_dev_memory(_connected[endpoint][0].handle, ctypes.byref(free), ctypes.byref(total))


def model_devices(endpoints: Sequence[Endpoint]) -> ctypes.Array | None:
    """What a model's `llama_model_params.devices` must hold: None (llama.cpp's default, every device)
    until an RPC server is connected; then a NULL-terminated array: the RPC devices of `endpoints`,
    then this machine's GPUs."""
    if not endpoints and not _connected:
        return None
    chosen = connect(endpoints) + [device for device in devices() if device.is_local_accelerator]
    return (ctypes.c_void_p * (len(chosen) + 1))(*[device.handle for device in chosen], None)


def placement(endpoints: Sequence[Endpoint], n_gpu_layers: int) -> str:
    """Where a model loaded with these endpoints runs, in a few words: 'RPC 10.0.0.2:50052 + CUDA0'."""
    remote = [str(endpoint) for endpoint in endpoints] if n_gpu_layers != 0 else []
    local = [device.name for device in devices() if device.is_local_accelerator] if n_gpu_layers != 0 else []
    if not remote:
        return " + ".join(local) if local else "CPU"
    return " + ".join([f"RPC {', '.join(remote)}", *local])


# --- a server lost mid-run -----------------------------------------------------------------------------

def exiting(code: int) -> Callable[[str], None]:
    """A lost-server handler for a command: what was printed stays, then one line, then exit `code`
    (no unwinding: the decode that failed never returns)."""

    def handler(message: str) -> None:
        sys.stdout.flush()
        print(f"error: {message}", file=sys.stderr, flush=True)
        os._exit(code)

    return handler


_lost_handler: Callable[[str], None] = exiting(RpcServerError.exit_code)
_abort_callback_installed = False


def on_server_lost(handler: Callable[[str], None]) -> None:
    """Call `handler(one line)` when ggml aborts while RPC servers are in use. It runs on ggml's
    thread, which is parked for good once it returns (ggml would abort the process after it)."""
    global _lost_handler
    _lost_handler = handler


_lost: str | None = None


def lost() -> str | None:
    """Why the RPC servers cannot be used any more; None while they can. Models are then never freed:
    freeing would wait on ggml's parked thread."""
    return _lost


@_ABORT_CALLBACK
def _abort_callback(raw: bytes | None) -> None:
    global _lost
    message = (raw or b"").decode(errors="replace")
    if "ggml-rpc" not in message:  # not the link's failure: ggml prints nothing of it now, so say it, then abort
        print(f"llama.cpp aborted: {message}", file=sys.stderr, flush=True)
        return
    detail = message.split(": ", 1)[-1].strip()
    servers = ", ".join(map(str, _connected)) or "?"
    _lost = f"lost the RPC server {servers} (llama.cpp: {detail})"
    _lost_handler(_lost)
    threading.Event().wait()  # the handler returned: park this thread for good, never letting ggml abort


def _install_abort_callback() -> None:
    global _abort_callback_installed
    if not _abort_callback_installed:
        _ggml().ggml_set_abort_callback(ctypes.cast(_abort_callback, ctypes.c_void_p))
        _abort_callback_installed = True


# --- serving this machine's devices ----------------------------------------------------------------------

def serving_devices(names: Sequence[str] = ()) -> list[Device]:
    """The devices `speccli rpc-server` offers: those named, else every GPU here, else the CPU (as
    llama.cpp's rpc-server chooses)."""
    local = [device for device in devices(memory=True) if not device.is_rpc]
    if names:
        by_name = {device.name.lower(): device for device in local}
        unknown = [name for name in names if name.lower() not in by_name]
        if unknown:
            raise SpeccliError(f"--device {','.join(names)}: no device {unknown[0]!r} here; this machine has "
                               f"{', '.join(device.name for device in local)}")
        return [by_name[name.lower()] for name in names]
    return [device for device in local if device.kind != "CPU"] or [device for device in local if device.kind == "CPU"]


def server(address: str, port: int, served: Sequence[Device], threads: int, cache: Path | None) -> Callable[[], None]:
    """llama.cpp's RPC server on address:port, to run on a thread of its own: it returns only if it fails to
    start. Looked up here, so that a build without the RPC backend is one line before any thread starts."""
    start = _rpc_function("ggml_backend_rpc_start_server", _START_SERVER)
    handles = (ctypes.c_void_p * len(served))(*[device.handle for device in served])
    return lambda: start(f"{address}:{port}".encode(), os.fsencode(cache) if cache else None, threads, len(served), handles)
