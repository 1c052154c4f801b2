"""A loopback TCP proxy that adds a fixed one-way latency (and optionally a bandwidth cap) to a link:
a stand-in for a network between a client and a server on this machine. Standard library only.

    with DelayProxy(("127.0.0.1", 50052), one_way_ms=0.5, mbit=None) as proxy:
        ...connect to ("127.0.0.1", proxy.port)...

    python tests/benchmarks/delay_proxy.py --to 127.0.0.1:50052 --one-way-ms 2 [--mbit 1000] [--port 0]

The proxy listens on 127.0.0.1 (port 0: a free one, printed first as `delay_proxy: listening on
127.0.0.1:PORT -> HOST:PORT ...`) and opens one upstream connection per client connection.

Each direction of a connection is a pipe with latency, not a per-chunk sleep: a chunk read at time t
is written to the other side at t + delay, whatever else is in flight, so ten small messages sent at
once all arrive about one delay later (not ten). Order is kept: one reader and one writer thread per
direction, a FIFO between them, due times that never decrease. With `mbit`, each direction is also a
link of that rate: a chunk starts on the wire once the one before it has left, takes size / rate to
send, and arrives one delay after its last bit left (serialisation, then propagation).

TCP_NODELAY is set on both sides, so small writes are not held back by Nagle's algorithm on top of
the delay. When either side closes (or fails), what it sent before closing is still delivered (after
the delay), then both connections are closed.
"""
from __future__ import annotations

import argparse
import collections
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Deque, Optional, Tuple

CHUNK = 256 * 1024  # read size: big enough that a model upload is not held back by the proxy itself
_EOF = None  # what a reader queues once its side has closed


@dataclass
class LinkStats:
    """What went through a proxy, over all its connections."""

    connections: int = 0
    bytes_up: int = 0  # client -> server
    bytes_down: int = 0  # server -> client
    chunks_up: int = 0
    chunks_down: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, upstream: bool, size: int) -> None:
        with self.lock:
            if upstream:
                self.bytes_up += size
                self.chunks_up += 1
            else:
                self.bytes_down += size
                self.chunks_down += 1

    def as_dict(self) -> dict:
        with self.lock:
            return {"connections": self.connections, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                    "chunks_up": self.chunks_up, "chunks_down": self.chunks_down}


class _Direction:
    """One direction of one connection: a reader thread stamps each chunk with its due time and queues
    it; a writer thread sends each when it is due. A queued None (_EOF) closes the pair once due."""

    def __init__(self, pair: "_Pair", source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        self.pair, self.source, self.sink, self.upstream = pair, source, sink, upstream
        self.queue: Deque[Tuple[float, Optional[bytes]]] = collections.deque()
        self.ready = threading.Condition()
        self.link_free = 0.0  # when the link (with a bandwidth cap) has sent everything queued so far
        name = "up" if upstream else "down"
        self.reader = threading.Thread(target=self._read, name=f"delay-proxy-{name}-read", daemon=True)
        self.writer = threading.Thread(target=self._write, name=f"delay-proxy-{name}-write", daemon=True)

    def start(self) -> None:
        self.reader.start()
        self.writer.start()

    def _due(self, size: int) -> float:
        now = time.monotonic()
        proxy = self.pair.proxy
        if proxy.bytes_per_second is None:
            return now + proxy.delay
        self.link_free = max(now, self.link_free) + size / proxy.bytes_per_second
        return self.link_free + proxy.delay

    def _put(self, due: float, data: Optional[bytes]) -> None:
        with self.ready:
            self.queue.append((due, data))
            self.ready.notify()

    def _read(self) -> None:
        try:
            while True:
                data = self.source.recv(CHUNK)
                if not data:
                    break
                self.pair.proxy.stats.add(self.upstream, len(data))
                self._put(self._due(len(data)), data)
        except OSError:
            pass  # reset, or closed under us by the other direction: end this direction like an EOF
        self._put(self._due(0), _EOF)

    def _write(self) -> None:
        try:
            while True:
                with self.ready:
                    while not self.queue:
                        self.ready.wait()
                    due, data = self.queue.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if data is _EOF:
                    break
                self.sink.sendall(data)
        except OSError:
            pass
        self.pair.close()


class _Pair:
    """A client connection and its upstream connection, each direction delayed."""

    def __init__(self, proxy: "DelayProxy", client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.closed = False
        self.lock = threading.Lock()
        self.directions = (_Direction(self, client, server, True), _Direction(self, server, client, False))

    def start(self) -> None:
        for direction in self.directions:
            direction.start()

    def close(self) -> None:
        """Close both sockets once (shutdown first: it wakes a reader blocked in recv)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.proxy._forget(self)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for direction in self.directions:
            for thread in (direction.reader, direction.writer):
                if thread is not threading.current_thread():
                    thread.join(max(0.0, deadline - time.monotonic()))


class DelayProxy:
    """Listens on `listen` (127.0.0.1, port 0: a free one) and forwards every connection to `target`,
    each direction delayed by `one_way_ms` and, with `mbit`, capped at that many Mbit/s."""

    def __init__(self, target: Tuple[str, int], one_way_ms: float = 0.0, mbit: Optional[float] = None,
                 listen: Tuple[str, int] = ("127.0.0.1", 0), connect_timeout: float = 5.0) -> None:
        if one_way_ms < 0:
            raise ValueError(f"one_way_ms must be >= 0, got {one_way_ms}")
        if mbit is not None and mbit <= 0:
            raise ValueError(f"mbit must be > 0, got {mbit}")
        self.target = (target[0], int(target[1]))
        self.one_way_ms, self.mbit = one_way_ms, mbit
        self.delay = one_way_ms / 1000.0
        self.bytes_per_second = None if mbit is None else mbit * 1e6 / 8
        self.connect_timeout = connect_timeout
        self.stats = LinkStats()
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(listen)
        self._listener.listen(16)
        self._listener.settimeout(0.1)  # the accept loop looks at _stopping this often
        self.host, self.port = self._listener.getsockname()[:2]
        self._acceptor = threading.Thread(target=self._accept, name="delay-proxy-accept", daemon=True)
        self._started = False

    @property
    def address(self) -> Tuple[str, int]:
        return self.host, self.port

    def describe(self) -> str:
        cap = f", {self.mbit:g} Mbit/s each way" if self.mbit is not None else ""
        return (f"{self.host}:{self.port} -> {self.target[0]}:{self.target[1]}, "
                f"{self.one_way_ms:g} ms one way{cap}")

    def start(self) -> "DelayProxy":
        if not self._started:
            self._started = True
            self._acceptor.start()
        return self

    def __enter__(self) -> "DelayProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            client.settimeout(None)
            try:
                server = socket.create_connection(self.target, timeout=self.connect_timeout)
                server.settimeout(None)
            except OSError:
                client.close()  # the client sees its connection closed, as if the server had refused it
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(self, client, server)
            with self._lock:
                if self._stopping.is_set():
                    pair.close()
                    break
                self._pairs.add(pair)
                self.stats.connections += 1
            pair.start()

    def _forget(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting, close every connection, and wait (up to `timeout`) for the threads."""
        self._stopping.set()
        if self._started:
            self._acceptor.join(timeout)
        self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.close()
        for pair in pairs:
            pair.join(timeout)


def _endpoint(text: str) -> Tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--to", type=_endpoint, required=True, metavar="HOST:PORT", help="where to forward")
    parser.add_argument("--one-way-ms", type=float, default=0.0, help="latency added each way (ms)")
    parser.add_argument("--mbit", type=float, default=None, help="bandwidth cap each way (Mbit/s; default: none)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with DelayProxy(args.to, args.one_way_ms, args.mbit, listen=(args.host, args.port)) as proxy:
        print(f"delay_proxy: listening on {proxy.describe()}; Ctrl-C stops it", flush=True)
        while not stop.wait(0.2):
            pass
        print(f"delay_proxy: stopped; {proxy.stats.as_dict()}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
