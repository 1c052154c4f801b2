"""tests/benchmarks/delay_proxy.py, the latency proxy rpc_link.py puts in front of an RPC server: bytes
intact and in order, a round trip of two delays, a pipe's latency (not a sleep per chunk), the
bandwidth cap, closing, and the script's first line. Real sockets on 127.0.0.1; every wait bounded."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.benchmarks.delay_proxy import DelayProxy

TIMEOUT = 10.0  # no test waits longer than this for anything
ROOT = Path(__file__).resolve().parent.parent


class EchoServer:
    """Echoes every connection's bytes back; records when each connection's bytes arrived and whether
    the connection was seen to close."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.arrivals: list[tuple[float, int]] = []  # (monotonic time, total bytes so far), last connection
        self.closed = threading.Event()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._echo, args=(connection,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _echo(self, connection: socket.socket) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.settimeout(TIMEOUT)
        self.arrivals = []
        total = 0
        with connection:
            try:
                while data := connection.recv(65536):
                    total += len(data)
                    self.arrivals.append((time.monotonic(), total))
                    connection.sendall(data)
            except OSError:
                pass
        self.closed.set()

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()
        for thread in self.threads:
            thread.join(TIMEOUT)


@pytest.fixture
def echo():
    server = EchoServer()
    yield server
    server.close()


def connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def receive(client: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = client.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def test_bytes_arrive_intact_and_in_order(echo):
    payload = os.urandom(3 << 20)  # several of the proxy's 256 KiB reads, in pieces of odd sizes
    with DelayProxy(("127.0.0.1", echo.port), one_way_ms=1) as proxy, connect(proxy.port) as client:
        def send() -> None:
            for start in range(0, len(payload), 70_001):
                client.sendall(payload[start:start + 70_001])

        sender = threading.Thread(target=send, daemon=True)
        sender.start()  # meanwhile read: the echo would stall on full buffers otherwise
        back = receive(client, len(payload))
        sender.join(TIMEOUT)
    assert len(back) == len(payload)
    assert back == payload


def test_a_round_trip_takes_two_one_way_delays(echo):
    with DelayProxy(("127.0.0.1", echo.port), one_way_ms=20) as proxy, connect(proxy.port) as client:
        client.sendall(b"warm")  # the upstream connection is open and the echo thread running
        assert receive(client, 4) == b"warm"
        started = time.monotonic()
        client.sendall(b"ping")
        assert receive(client, 4) == b"ping"
        elapsed = time.monotonic() - started
    assert 0.040 <= elapsed < 0.200


def test_messages_sent_at_once_arrive_together_one_delay_later(echo):
    """A pipe with latency: ten messages in flight together take one delay, not ten."""
    delay = 0.050
    with DelayProxy(("127.0.0.1", echo.port), one_way_ms=delay * 1000) as proxy, connect(proxy.port) as client:
        client.sendall(b"warm")
        assert receive(client, 4) == b"warm"
        messages = [f"message {i:02d};".encode() for i in range(10)]
        started = time.monotonic()
        for message in messages:
            client.sendall(message)  # TCP_NODELAY: each its own segment, so its own chunk at the proxy
        back = receive(client, sum(map(len, messages)))
        round_trip = time.monotonic() - started
        arrived = [t - started for t, total in echo.arrivals if total > 4]
    assert back == b"".join(messages)
    assert arrived and delay <= arrived[0] and arrived[-1] < 2.5 * delay  # one way: all within ~ one delay
    assert 2 * delay <= round_trip < 4 * delay  # not 10 or 20 delays


def test_a_bandwidth_cap_paces_the_bytes(echo):
    size = 100_000  # at 8 Mbit/s (1 MB/s): 0.1 s on the wire each way
    with DelayProxy(("127.0.0.1", echo.port), one_way_ms=0, mbit=8) as proxy, connect(proxy.port) as client:
        started = time.monotonic()
        client.sendall(b"x" * size)
        back = receive(client, size)
        elapsed = time.monotonic() - started
    assert back == b"x" * size
    assert 0.09 <= elapsed < 1.0  # at least one direction's 0.1 s (the two overlap, chunk by chunk)


def test_closing_the_client_closes_the_upstream_connection(echo):
    with DelayProxy(("127.0.0.1", echo.port), one_way_ms=5) as proxy:
        client = connect(proxy.port)
        client.sendall(b"hello")
        assert receive(client, 5) == b"hello"
        client.close()
        assert echo.closed.wait(TIMEOUT)


def test_a_server_that_closes_closes_the_client(echo):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(TIMEOUT)

    def serve_once() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"bye")  # and close: the client must get the bytes, then EOF

    server = threading.Thread(target=serve_once, daemon=True)
    server.start()
    with listener, DelayProxy(listener.getsockname(), one_way_ms=5) as proxy, connect(proxy.port) as client:
        assert receive(client, 3) == b"bye"
        assert client.recv(1) == b""
    server.join(TIMEOUT)


def test_the_script_prints_its_port_and_forwards(echo):
    script = ROOT / "tests" / "benchmarks" / "delay_proxy.py"
    process = subprocess.Popen([sys.executable, str(script), "--to", f"127.0.0.1:{echo.port}", "--one-way-ms", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("delay_proxy: listening on 127.0.0.1:"), line
        port = int(line.split("127.0.0.1:", 1)[1].split(" ", 1)[0])
        with connect(port) as client:
            client.sendall(b"through")
            assert receive(client, 7) == b"through"
    finally:
        process.terminate()
        process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0
