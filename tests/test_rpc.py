"""The target over llama.cpp's RPC backend: real `speccli rpc-server` processes on free loopback ports,
real tiny GGUF models, the same promises as on one machine (greedy identity with the target alone here,
its exact distribution), and every fault a link brings: one line each, the usual exit code."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from speccli.core.generator import Generator
from speccli.core.parting import find_parting
from speccli.core.sampling import SamplingParams
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import Planner
from speccli.drafting.policy import FixedK
from speccli.llama import rpc
from speccli.llama.model import LoadOptions, Model
from speccli.validation import Endpoint, parse_endpoints, parse_tensor_split
from speccli.errors import SpeccliError
from tests.benchmarks.delay_proxy import DelayProxy
from tests.test_engine_distribution_steps import (
    LENGTH, SETTINGS, first_tokens_p_value, generate, truncate_keeping_the_rejected_entries,
)
from tests.test_engine_greedy import PROMPTS, greedy_tokens
from tests.tiny_gguf import write_related_pair
from tests.token_distribution import exact_distribution

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
GREEDY = SamplingParams(temperature=0)


class RpcServer:
    """`speccli rpc-server --port 0` in its own process; its stdout read as it comes (llama.cpp's server
    logs each client there)."""

    def __init__(self, *options: str) -> None:
        command = [sys.executable, "-m", "speccli", "rpc-server", "--port", "0", "--threads", "1", *options]
        self.process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 30
        try:
            while not (match := re.search(r"^speccli rpc-server: .* on [\d.]+:(\d+) with 1 threads", self.next_line(30))):
                assert time.monotonic() < deadline and self.process.poll() is None, "".join(self.log)
        except BaseException:
            self.stop()  # never left running past a failed start
            raise
        self.endpoint = Endpoint("127.0.0.1", int(match.group(1)))  # listening from this line on

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
            self.log.append(line)

    def next_line(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the RPC server printed nothing within {timeout} s") from None

    def exited(self, timeout: float) -> int:
        """Its exit code, within `timeout`; past it, a failure that says how the process and this one
        stood with the signals (an interrupt ignored or blocked is inherited from the parent)."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if self.process.poll() is not None:  # it ended while this looked: no state left to name
                return self.process.returncode
            with open(f"/proc/{self.process.pid}/status") as status:
                masks = [line.strip() for line in status if line.startswith(("Sig", "Shd", "State", "Threads"))]
            ours = signal.pthread_sigmask(signal.SIG_BLOCK, [])
            raise AssertionError(f"still running {timeout} s after the signal: {masks}; this process blocks "
                                 f"{sorted(ours)}, SIGINT handler {signal.getsignal(signal.SIGINT)}") from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@contextmanager
def rpc_server(*options: str) -> Iterator[RpcServer]:
    server = RpcServer(*options)
    try:
        yield server
    finally:
        server.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory) -> tuple[Path, Path]:
    return write_related_pair(tmp_path_factory.mktemp("rpc"), target_layers=4, draft_layers=2, eps=0.3)


@pytest.fixture(scope="module")
def server():
    with rpc_server() as running:
        yield running


@pytest.fixture(scope="module")
def remote_pair(pair_files, server):
    """(target over RPC, draft here, the same target loaded here): one thread each, a 256-token context."""
    target_path, draft_path = pair_files
    rpc.connect([server.endpoint])
    local = LoadOptions(n_ctx=256, n_threads=1)
    remote = LoadOptions(n_ctx=256, n_threads=1, rpc=(server.endpoint,))
    with Model(target_path, remote) as target, Model(draft_path, local) as draft, Model(target_path, local) as alone:
        yield target, draft, alone


# --- the options --------------------------------------------------------------------------------------


def test_endpoints_are_parsed_once_each_and_refused_in_one_line() -> None:
    assert parse_endpoints("10.0.0.2:50052, box:1") == (Endpoint("10.0.0.2", 50052), Endpoint("box", 1))
    # docs/cli.md's rule: text not of HOST:PORT's shape is a usage error (2); an endpoint of that shape
    # that cannot be used is a value refused (1).
    for text, why, code in [("10.0.0.2", "is not HOST:PORT", 2), (":50052", "is not HOST:PORT", 2),
                            ("a:0", "not a number from 1", 1), ("a:x", "not a number from 1", 2),
                            ("a:1,a:1", "is named twice", 1), ("a:1,", "'' is not HOST:PORT", 2),
                            ("[::1]:5", "is an IPv6 address, which llama.cpp's RPC does not support", 1),
                            ("::1:5", "is an IPv6 address", 1), ("127.0.0.1 :50052", "'127.0.0.1 :50052' is not HOST:PORT", 2)]:
        with pytest.raises(SpeccliError, match=re.escape(why)) as refused:
            parse_endpoints(text)
        assert refused.value.exit_code == code, text


def test_tensor_split_is_shares_at_least_one_above_zero() -> None:
    assert parse_tensor_split("3,1") == (3.0, 1.0)
    for text, code in [("3,x", 2), ("0,0", 1), ("-1,2", 1), ("nan", 1), (",".join("1" * 17), 1)]:
        with pytest.raises(SpeccliError, match="--tensor-split") as refused:
            parse_tensor_split(text)
        assert refused.value.exit_code == code, text


def test_a_pairs_rpc_key_is_read_and_checked(tmp_path) -> None:
    from speccli.models.config import load_registry

    good = tmp_path / "good.toml"
    good.write_text('[pairs.far]\ntarget = "gemma3-270m-f32"\ndraft = "gemma3-270m-q4km"\nrpc = "10.0.0.2:50052,10.0.0.3:50052"\n')
    assert load_registry(good).pairs["far"].rpc == (Endpoint("10.0.0.2", 50052), Endpoint("10.0.0.3", 50052))
    bad = tmp_path / "bad.toml"
    bad.write_text('[pairs.far]\ntarget = "gemma3-270m-f32"\ndraft = "gemma3-270m-q4km"\nrpc = "10.0.0.2"\n')
    with pytest.raises(SpeccliError, match=r"bad\.toml: pairs\.far\.rpc '10\.0\.0\.2': '10\.0\.0\.2' is not HOST:PORT") as refused:
        load_registry(bad)
    assert refused.value.exit_code == 1  # a value in a file that reads, as `rpc = 50052` (an integer) is
    bad.write_text('[pairs.far]\ntarget = "gemma3-270m-f32"\ndraft = "gemma3-270m-q4km"\nrpc = 50052\n')
    with pytest.raises(SpeccliError, match=r"pairs\.far\.rpc: expected a non-empty string") as refused:
        load_registry(bad)
    assert refused.value.exit_code == 1


def test_every_build_of_setup_has_the_rpc_backend() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_setup", REPO / ".ci" / "setup.py")
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    assert setup.with_rpc("-DGGML_NATIVE=OFF") == "-DGGML_NATIVE=OFF -DGGML_RPC=ON"
    assert setup.with_rpc("") == "-DGGML_RPC=ON"
    assert setup.with_rpc("-DGGML_RPC=OFF") == "-DGGML_RPC=OFF"  # the user's word on it stands
    assert rpc.available(), "this install's llama.cpp has no RPC backend: run python3 .ci/setup.py"


# --- the server command --------------------------------------------------------------------------------


@pytest.mark.parametrize("interrupt, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_the_server_serves_its_cpu_and_stops_promptly(interrupt, code) -> None:
    with rpc_server() as server:
        assert rpc.hello(server.endpoint) == rpc.PROTOCOL
        server.process.send_signal(interrupt)
        assert server.exited(5) == code
        assert "Traceback" not in server.process.stderr.read()


def test_a_port_in_use_and_a_bad_host_are_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "speccli", "rpc-server", "--port", str(port)], env=ENV,
                              capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"error: --host 127.0.0.1 --port {port}: cannot listen there (the port is in use)\n"
    done = subprocess.run([sys.executable, "-m", "speccli", "rpc-server", "--host", "no such host.invalid"], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("error: --host 'no such host.invalid': not an IPv4 address or a host name this machine can "
                           "resolve\n")


@pytest.mark.parametrize("args, complaint", [
    # An unset variable must not open an unauthenticated port on every interface (it had, with a warning).
    (["--host", ""], "--host is empty; give an address (0.0.0.0 listens on every interface)"),
    (["--host", "::1"], "--host '::1': an IPv6 address; llama.cpp's RPC server listens on IPv4 addresses only"),
    (["--device", ""], "--device '': a device name is empty; `speccli env` lists them"),
    (["--device", "CPU,cpu"], "--device 'CPU,cpu': cpu is named twice"),
    (["--port", "-1"], "--port must be between 0 and 65535, got -1"),  # as serve says it, with serve's code
    (["--threads", "0"], "--threads must be >= 1, got 0"),
])
def test_rpc_server_refuses_bad_values_in_one_line_with_exit_1(args, complaint) -> None:
    from typer.testing import CliRunner

    from speccli.cli.app import app

    result = CliRunner().invoke(app, ["rpc-server", *args])
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"error: {complaint}\n")


def test_placement_options_that_would_do_nothing_are_refused(tiny_pair) -> None:
    from tests.test_chat import chat

    local_gpus = sum(device.is_local_accelerator for device in rpc.devices())
    shares = ",".join(["1"] * (local_gpus + 1))
    where = f"{local_gpus} device{'s' if local_gpus != 1 else ''}" if local_gpus else "no device (no --rpc server, no GPU)"
    for args, complaint in [
        (["--rpc-draft"], "--rpc-draft puts the draft on the RPC servers, and none are given (--rpc, or the pair's rpc)"),
        (["--tensor-split", shares], f"--tensor-split {shares}: {local_gpus + 1} shares, and {where} to split the "
                                     "target over (the RPC servers' devices, then this machine's GPUs)"),
    ]:
        result = chat(tiny_pair, *args, "-p", "Hi", "-n", "2")
        # Options that cannot go together: a usage error (docs/cli.md).
        assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {complaint}\n")


def test_a_host_but_127_0_0_1_is_warned_about() -> None:
    with rpc_server("--host", "127.0.0.2") as server:
        assert rpc.hello(Endpoint("127.0.0.2", server.endpoint.port)) == rpc.PROTOCOL
        server.process.send_signal(signal.SIGINT)
        server.exited(5)
        warning = server.process.stderr.read()
    assert warning.startswith("warning: the RPC protocol has no authentication: anyone who can reach 127.0.0.2:")
    assert warning.count("\n") == 1


# --- the promise, over the link ------------------------------------------------------------------------


def test_greedy_with_the_target_over_rpc_equals_the_target_alone_here(remote_pair) -> None:
    """Speculative K=4 with the target on the server against the target alone on this machine (its own
    file, loaded here): equal, or parted at a near-tie of the local target's logits."""
    target, draft, alone = remote_pair
    drafted = 0
    for text in PROMPTS[:8]:
        prompt = alone.tokenizer.tokenize(text)
        reference, _, _ = greedy_tokens(Generator(alone, None, GREEDY), prompt, 24)
        speculative, _, stats = greedy_tokens(Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, FixedK(4)), prompt, 24)
        drafted += stats.positions.accepted
        parting = find_parting(alone, prompt, reference, speculative, 5)
        assert parting is None or parting.near_tie, f"{text!r}: {parting.describe()}"
    assert drafted > 0, "no draft token was ever kept: nothing was tested"


def test_sampling_with_the_target_over_rpc_gives_the_targets_distribution(remote_pair) -> None:
    """The first three tokens, K=2 model drafts, 2000 samples, against the exact distribution of the
    target loaded here; and the same run with rejected entries left in the remote KV cache, which the
    test must catch (a truncate that does not reach the server would be that bug)."""
    target, draft, alone = remote_pair
    prompt = alone.tokenizer.tokenize(b"hello world")
    expected = exact_distribution(alone, prompt, SETTINGS, LENGTH)
    generations, _ = generate(Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(2), seed=5), prompt, LENGTH)
    assert first_tokens_p_value(generations, expected) > 1e-3
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(target, "truncate", truncate_keeping_the_rejected_entries(target))
        broken, _ = generate(Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(2), seed=5), prompt, LENGTH,
                             fresh=True)
    target.reset()
    assert first_tokens_p_value(broken, expected) < 1e-6


def test_a_target_split_over_two_servers_gives_the_same_greedy_output(pair_files) -> None:
    """`--rpc A,B --tensor-split 1,1`: llama.cpp's own log shows a model buffer on each server, and bench's
    greedy check finds the speculative output identical to the target's own."""
    target_path, draft_path = pair_files
    with rpc_server() as first, rpc_server() as second:
        done = subprocess.run(
            [sys.executable, "-m", "speccli", "bench", "-m", str(target_path), "-md", str(draft_path), "-t", "1",
             "-c", "256", "-n", "16", "--k", "3", "--runs", "1", "--warmup", "0", "--prompts", str(short_prompts(target_path.parent)),
             "--rpc", f"{first.endpoint},{second.endpoint}", "--tensor-split", "1,1"],
            env={**ENV, "SPECCLI_LLAMA_LOG": "1", "COLUMNS": "200"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for server in (first, second):  # llama.cpp's load log: "RPC0[127.0.0.1:PORT] model buffer size = 0.56 MiB"
        assert re.search(rf"RPC\d\[{re.escape(str(server.endpoint))}\] model buffer size = +0\.[1-9]", done.stderr), done.stderr
    assert f"target on RPC {first.endpoint}, {second.endpoint}, draft on CPU" in done.stdout
    assert "greedy check: 2/2 speculative outputs identical to the target's own" in done.stdout


def short_prompts(directory: Path) -> Path:
    path = directory / "prompts.jsonl"
    path.write_text('{"task": "a", "prompt": "hello world hello world"}\n{"task": "b", "prompt": "the cat sat on"}\n')
    return path


# --- faults -------------------------------------------------------------------------------------------


def chat_over(pair_files, endpoint: str, *options: str, **run) -> subprocess.CompletedProcess:
    target_path, draft_path = pair_files
    return subprocess.run([sys.executable, "-m", "speccli", "chat", "-m", str(target_path), "-md", str(draft_path),
                           "-t", "1", "-c", "256", "-p", "hi", "--rpc", endpoint, *options],
                          env=ENV, capture_output=True, text=True, timeout=60, **run)


def test_nothing_listening_is_named_before_any_model_loads(pair_files) -> None:
    port = free_port()
    began = time.monotonic()
    done = chat_over(pair_files, f"127.0.0.1:{port}")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"error: RPC server 127.0.0.1:{port}: nothing listens there (connection refused); start one "
                           f"there with `speccli rpc-server --port {port}`\n")
    assert time.monotonic() - began < 20


@contextmanager
def fake_server(answer: bytes | None) -> Iterator[int]:
    """A listener on a free loopback port that reads a hello and sends `answer` (None: never accepts)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(64)
                connection.sendall(answer or b"")

    if answer is not None:
        threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        if answer is not None:  # wake the accept thread so it sees `stop` and ends
            socket.create_connection(listener.getsockname(), timeout=1).close()
        listener.close()


def hello_reply(major: int, minor: int, patch: int) -> bytes:
    return struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24)


@pytest.mark.parametrize("answer, line", [
    (hello_reply(6, 1, 0), "RPC server 127.0.0.1:{port} speaks RPC protocol 6.1.0, this build speaks 7.0.0: use the "
                           "same speccli or llama.cpp release on both machines"),
    (hello_reply(7, 3, 0), "RPC server 127.0.0.1:{port} speaks RPC protocol 7.3.0, this build speaks 7.0.0: use the "
                           "same speccli or llama.cpp release on both machines"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "RPC server 127.0.0.1:{port}: did not answer the RPC hello of protocol 7.0.0: "
                                          "not an RPC server, or one of another llama.cpp version (use the same speccli "
                                          "or llama.cpp release on both machines)"),
    # It listens and says nothing: not "a wrong address, a firewall", which the connection rules out.
    (None, "RPC server 127.0.0.1:{port}: connected, but no reply to the RPC hello within 3 s: not an RPC server, or "
           "one busy with another client"),
], ids=["older", "newer", "not-rpc", "silent"])
def test_a_server_of_another_protocol_or_none_is_named(pair_files, answer, line) -> None:
    with fake_server(answer) as port:
        done = chat_over(pair_files, f"127.0.0.1:{port}")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "error: " + line.format(port=port) + "\n"


@contextmanager
def slow_link(server: RpcServer, one_way_ms: float = 15) -> Iterator[str]:
    """The server behind a delay proxy: each decode costs round trips, so a reply lasts long enough to
    lose the server in its middle."""
    with DelayProxy(("127.0.0.1", server.endpoint.port), one_way_ms=one_way_ms) as proxy:
        slow_link.proxy = proxy
        yield f"127.0.0.1:{proxy.port}"


def wait_until_decoding(timeout: float = 60) -> None:
    """Until the client is past its load and decoding: replies keep coming back over the link (the check
    before loading, and the load, each end; decodes go on)."""
    stats, deadline = slow_link.proxy.stats, time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = stats.as_dict()["chunks_down"]
        time.sleep(0.5)
        if stats.as_dict()["connections"] >= 2 and stats.as_dict()["chunks_down"] - before >= 5:
            return
    raise AssertionError("the client never decoded over the link")


def test_a_server_lost_mid_reply_ends_chat_with_one_line_and_keeps_the_reply_so_far(pair_files) -> None:
    target_path, draft_path = pair_files
    with rpc_server() as server, slow_link(server) as link:
        chat = subprocess.Popen([sys.executable, "-m", "speccli", "chat", "-m", str(target_path), "-md", str(draft_path),
                                 "-t", "1", "-c", "256", "-n", "200", "--temp", "0", "-p", "hello world", "--rpc", link],
                                env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            first = chat.stdout.read(1)  # the reply has begun
            server.stop()
            rest, errors = chat.communicate(timeout=60)
        finally:
            if chat.poll() is None:
                chat.kill()
    assert chat.returncode == 1 and first, "the reply had begun, and what was printed of it stays"
    last = errors.decode().strip().splitlines()[-1]
    assert re.fullmatch(rf"error: lost the RPC server 127\.0\.0\.1:{link.split(':')[1]} \(llama\.cpp: .+\)", last), errors
    assert b"Traceback" not in errors


def test_a_server_lost_mid_bench_is_one_line_and_exit_1(pair_files) -> None:
    target_path, draft_path = pair_files
    with rpc_server() as server, slow_link(server) as link:
        bench = subprocess.Popen([sys.executable, "-m", "speccli", "bench", "-m", str(target_path), "-md", str(draft_path),
                                  "-t", "1", "-c", "256", "-n", "64", "--k", "2", "--rpc", link,
                                  "--prompts", str(short_prompts(target_path.parent))],
                                 env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until_decoding()
            server.stop()
            _, errors = bench.communicate(timeout=60)
        finally:
            if bench.poll() is None:
                bench.kill()
    assert bench.returncode == 1, errors
    assert re.search(r"^error: lost the RPC server 127\.0\.0\.1:\d+ \(llama\.cpp: .+\)$", errors, re.MULTILINE), errors
    assert "Traceback" not in errors


def test_a_server_lost_mid_reply_makes_serve_answer_503_and_say_why_on_health(pair_files) -> None:
    target_path, draft_path = pair_files
    with rpc_server() as server, slow_link(server) as link:
        serve = subprocess.Popen([sys.executable, "-m", "speccli", "serve", "-m", str(target_path), "-md", str(draft_path),
                                  "-t", "1", "-c", "256", "--port", "0", "--rpc", link],
                                 env=ENV, stderr=subprocess.PIPE, text=True)
        try:
            said = serve.stderr.readline()
            assert said.startswith("note: the target has no chat template"), said  # told once, before serving
            url = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", serve.stderr.readline()).group(1)
            body = {"model": target_path.stem, "prompt": "hello world", "max_tokens": 200, "temperature": 0, "stream": True}
            with urllib.request.urlopen(post(f"{url}/v1/completions", body), timeout=60) as response:
                assert response.status == 200
                assert response.readline().startswith(b"data:")  # the reply has begun
                server.stop()
                tail = response.read().decode()
            assert "lost the RPC server" in tail, tail
            health = http_error(urllib.request.Request(f"{url}/health"))
            assert health.code == 503 and "lost the RPC server" in json.load(health)["reason"]
            again = http_error(post(f"{url}/v1/completions", {**body, "stream": False}))
            assert again.code == 503 and "lost the RPC server" in json.load(again)["error"]["message"]
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(timeout=20) == 0
            assert "Traceback" not in serve.stderr.read()
        finally:
            if serve.poll() is None:
                serve.kill()


def post(url: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


def http_error(request: urllib.request.Request) -> urllib.error.HTTPError:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    return refused.value


def test_the_draft_goes_to_the_server_only_when_asked_and_quant_check_runs_there(pair_files) -> None:
    target_path, draft_path = pair_files
    with rpc_server() as server:  # its own: a server serves one client at a time, and this process holds `server`
        remote_draft_and_quant_check(target_path, draft_path, server)


def remote_draft_and_quant_check(target_path: Path, draft_path: Path, server: RpcServer) -> None:
    lookup = subprocess.run([sys.executable, "-m", "speccli", "chat", "-m", str(target_path), "--spec", "ngram", "-t", "1",
                             "-c", "256", "-n", "4", "-p", "hi", "--rpc", str(server.endpoint)],
                            env=ENV, capture_output=True, text=True, timeout=120)
    assert lookup.returncode == 0 and "Traceback" not in lookup.stderr, lookup.stderr  # with no draft model to place
    done = subprocess.run(
        [sys.executable, "-m", "speccli", "bench", "-m", str(target_path), "-md", str(draft_path), "-t", "1", "-c", "256",
         "-n", "16", "--k", "3", "--runs", "1", "--warmup", "0", "--prompts", str(short_prompts(target_path.parent)),
         "--rpc", str(server.endpoint), "--rpc-draft", "--json", str(target_path.parent / "remote.json")],
        env={**ENV, "COLUMNS": "200"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"target on RPC {server.endpoint}, draft on RPC {server.endpoint}" in done.stdout
    report = json.loads((target_path.parent / "remote.json").read_text())
    environment = report["environment"]
    assert (environment["target_runs_on"], environment["draft_runs_on"]) == (f"RPC {server.endpoint}",) * 2
    assert report["command"].endswith(f"--rpc {server.endpoint} --rpc-draft")  # reruns where it ran
    checked = subprocess.run([sys.executable, "-m", "speccli", "quant-check", str(target_path), str(target_path), "-t", "1",
                              "--rpc", str(server.endpoint), "--json"], env=ENV, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["candidates"][0]["verdict"] == "OK"


@pytest.mark.gemma
def test_gemma_over_rpc_gives_the_greedy_output_of_gemma_here(gemma_pair, server) -> None:
    """The bundled pair's F32 target on the server, its Q4_K_M draft here: K=4 greedy against the same
    target loaded here, alone (partings only at near-ties of its logits)."""
    from speccli.models.config import load_registry
    from speccli.models.resolve import resolve_pair

    alone, draft = gemma_pair
    resolved = resolve_pair(None, None, None, load_registry(), quiet=True)
    rpc.connect([server.endpoint])
    with Model(resolved.target_path, LoadOptions(n_ctx=512, rpc=(server.endpoint,))) as target:
        for text in PROMPTS[:3]:
            prompt = alone.tokenizer.tokenize(text)
            reference, _, _ = greedy_tokens(Generator(alone, None, GREEDY), prompt, 32)
            speculative, _, _ = greedy_tokens(Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, FixedK(4)), prompt, 32)
            parting = find_parting(alone, prompt, reference, speculative, 5)
            assert parting is None or parting.near_tie, f"{text!r}: {parting.describe()}"


def test_env_lists_a_servers_device_as_rpc_not_gpu():
    """ggml types every RPC device a GPU: `env --rpc` had listed this CPU's server as one."""
    with rpc_server() as server:
        done = subprocess.run([sys.executable, "-m", "speccli", "env", "--rpc", str(server.endpoint)],
                              env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.endswith(str(server.endpoint)))
    assert line.split()[:2] == ["RPC0", "RPC"]
    # A server that cannot be reached is the one line: no table of this machine above it (a script
    # reading stdout had the table, then the failure)
    port = free_port()
    unreachable = subprocess.run([sys.executable, "-m", "speccli", "env", "--rpc", f"127.0.0.1:{port}"],
                                 env=ENV, capture_output=True, text=True, timeout=60)
    assert (unreachable.returncode, unreachable.stdout) == (1, "")
    assert unreachable.stderr.startswith(f"error: RPC server 127.0.0.1:{port}: nothing listens there")
