"""`speccli serve` underneath: load the models, bind the socket, run uvicorn until Ctrl-C, close all.

The socket is bound here, before uvicorn starts, so a port in use or a host that cannot be bound is
one clear error (uvicorn itself would log it and exit). Only the host given is bound.
"""
from __future__ import annotations

import asyncio
import ipaddress
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from speccli.errors import SpeccliError
from speccli.llama.model import Model
from speccli.llama.rpc import exiting, on_server_lost
from speccli.models.pair import LoadedPair, PairRequest, open_pair
from speccli.server.app import create_app
from speccli.server.metrics import Metrics
from speccli.server.service import Service
from speccli.drafting.registry import DEFAULT_SPEC
from speccli.remembered.learnt import LearntFile
from speccli.remembered.stores import open_store
from speccli.server.worker import Speculation, Worker
from speccli.util.format import escape_undecodable
from speccli.drafting.registry import check_spec, require_draft_model
from speccli.validation import API_KEY_VARIABLE, AUTO_K, DEFAULT_PARALLEL, MAX_SEQUENCES, K, check_api_key, check_listen


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    spec: str = DEFAULT_SPEC
    k: K = AUTO_K
    max_waiting: int = 16  # requests that may wait while the slots run; more get 503
    parallel: int = DEFAULT_PARALLEL  # slots: requests generated at once
    api_key: str | None = None  # clients must send `Authorization: Bearer KEY` (all but /health); None: open
    remember: bool = False  # earlier replies kept on disk for the suffix source (`--remember`)
    aliases: tuple[str, ...] = ()  # other names requests may give as `model` (the pair's, as the command named it)

    def validate(self) -> None:
        check_spec(self.spec)
        check_listen(self.host, self.port)
        if not 1 <= self.parallel <= MAX_SEQUENCES:
            raise SpeccliError(f"--parallel must be between 1 and {MAX_SEQUENCES} (llama.cpp's limit), got {self.parallel}")
        if self.max_waiting < 0:
            raise SpeccliError(f"--queue must be at least 0 (0: none waits), got {self.max_waiting}")
        if self.api_key is not None:
            check_api_key(self.api_key)


def model_id_for(name: str) -> str:
    """A registry name as it is; a GGUF path by its file name without .gguf (bytes of it that are not
    UTF-8 escaped: JSON carries text only)."""
    return escape_undecodable(Path(name).stem if name.endswith(".gguf") else name)


def build_service(model_id: str, target: Model, draft: Model | None, settings: ServeSettings) -> Service:
    metrics = Metrics()
    speculation = Speculation(settings.spec, settings.k)
    require_draft_model(settings.spec, draft)
    warn = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    store = open_store(target.tokenizer, model_id, settings.remember, warn)
    worker = Worker(target, draft, settings.max_waiting, metrics, store, LearntFile(target, draft, warn))
    on_server_lost(lambda reason: _answer_503_from_now_on(worker, reason))
    return Service(model_id, target, draft, speculation, worker, metrics, api_key=settings.api_key,
                   aliases=frozenset(settings.aliases) - {model_id})


def _answer_503_from_now_on(worker: Worker, reason: str) -> None:
    if worker.stopping:  # found as the models are freed on the way out: nothing left to answer, and the
        exiting(1)(reason)  # thread freeing them would wait on the lost server for good
    print(f"error: {reason}; answering 503 to every request until restarted", file=sys.stderr, flush=True)
    worker.lose(reason)


@contextmanager
def open_models(request: PairRequest) -> Iterator[tuple[str, LoadedPair]]:
    """(model id, the loaded pair): the target, and the draft model when the draft source needs one."""
    with open_pair(request) as pair:
        yield model_id_for(pair.resolved.target_name), pair


def bind(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit this (Linux). Without it a response's head and body, written
        # separately, wait on the client's delayed ACK: 40 ms per request on a kept-alive connection.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(128)  # connections made before uvicorn takes over wait rather than being refused
    except OSError as error:
        raise SpeccliError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def exposure_warning(host: str, address: str, api_key: str | None) -> str | None:
    """The line serve prints as it starts where it listens beyond this machine (`address`, the one bound:
    any but loopback, 0.0.0.0 and :: included) and no API key is asked for; None otherwise."""
    if api_key is not None:
        return None
    try:
        if ipaddress.ip_address(address.partition("%")[0]).is_loopback:
            return None
    except ValueError:
        pass
    return (f"warning: --host {host} is reachable beyond this machine and no API key is asked for: anyone who reaches "
            f"it can use the models (set {API_KEY_VARIABLE}, or --api-key)")


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_server(service: Service, sock: socket.socket, on_ready: Callable[[str], None] = lambda url: None) -> None:
    """Serve until Ctrl-C or SIGTERM, then stop the worker; the caller closes the models. uvicorn
    re-raises the signal once it has shut down; here that is the normal end, not an error."""
    server = _server(service)
    try:
        on_ready(url_of(sock))
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()


@contextmanager
def serving_in_thread(service: Service, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The server in a background thread (for tests and benchmarks): yields its base URL once it
    accepts requests, and stops it on leaving."""
    sock = bind(host, port)
    server = _server(service)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="speccli-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise SpeccliError("the server thread did not start")
            time.sleep(0.005)
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _server(service: Service) -> uvicorn.Server:
    """uvicorn serving the app quietly. The graceful shutdown is bounded: a stream still open when the
    server stops (a client that never reads, a test failing mid-stream) must not keep the worker
    decoding past it, into models the caller then closes."""
    config = uvicorn.Config(create_app(service), log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    return _Server(config, service)


class _Server(uvicorn.Server):
    """Stops the worker as the shutdown begins, not after it: the running and waiting requests are told
    so (a 503, or an error event ending a stream) and their connections close at once. Stopped only by
    the app's lifespan, they had waited out the graceful shutdown, a stream still growing, then been
    cancelled mid-response (a cut stream, a plain-text 500 and tracebacks in the log)."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await asyncio.to_thread(self.service.worker.stop)
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: object) -> None:
        """A second Ctrl-C or SIGTERM while stopping changes nothing. uvicorn would skip the app's
        shutdown, its lifespan task then cancelled mid-wait (a traceback), and the stop is bounded anyway
        (a step, and 2 s for open streams); skipping it could only lose the replies it saves."""
        if not self.should_exit:
            super().handle_exit(sig, frame)

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, but once the server has stopped, Ctrl-C and SIGTERM stay ignored while the models
        close and the process ends (its exit is 0, as for one Ctrl-C), rather than being put back and the
        first re-raised: a second signal then killed the process mid-teardown."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self.handle_exit)
        try:
            yield
        finally:
            for sig in HANDLED_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
