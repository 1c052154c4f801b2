"""Benchmark (not a test): speculative decoding with the target's layers behind an RPC link of a given
latency, speccli against llama.cpp's own tools over the same link.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/rpc_link.py                  # 0, 0.5 and 2 ms
    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/rpc_link.py --one-way-ms 0.5 --only a --n-predict 8

For each one-way latency (`--one-way-ms`, default 0,0.5,2) it starts ONE `speccli rpc-server --port 0
--threads N` (N: `--server-threads`, default 2) and a DelayProxy (tests/benchmarks/delay_proxy.py: that
latency each way, `--mbit` caps the bandwidth) in front of it, then runs on the Qwen target over
`--rpc 127.0.0.1:<proxy port>`, the draft (where there is one) here:

  a       speccli bench --spec ngram --k auto, the built-in `rewrite` prompt only
  b       speccli bench --spec model --k auto, the rewrite prompt
  c       speccli bench --spec ngram+model --k auto, every built-in prompt
  d-draft llama-speculative-simple --spec-type draft-simple (-md draft), the rewrite prompt
  d-ngram llama-speculative-simple --spec-type ngram-simple (no draft model), the rewrite prompt
  e-draft llama-server -md draft --spec-type draft-simple: one /completion request, the rewrite prompt
  e-target llama-server without -md: the same request, llama.cpp's target alone

round-robin (`--rounds`, default 1; odd rounds in reverse order), so that drift on the machine hits
every configuration alike. `--only a,c,d` runs some (d: both d-*, e: both e-*). Nothing is restarted
between configurations but llama-server (one per run of e-*); every subprocess has a timeout
(`--timeout`), and everything is stopped in `finally`.

Figures. speccli bench measures the target alone over the same link itself, on each prompt, alternated
with the speculative runs: a speccli row's tok/s is the speculative decode's (median over runs), and its
ratio is bench's own speedup (median of per-run ratios). llama.cpp rows: llama-speculative-simple's
"decoded N tokens in T seconds, speed: S t/s" (its decode loop; prompt processing apart), llama-server's
`timings.predicted_per_second` (decode only); their ratio is to llama-server without -md, over the same
link. Every rewrite row is also given as a ratio to speccli's target alone on the rewrite prompt (the
median of the rewrite baselines of a, b and c).

Prompt. Every tool gets the raw prompt text, no chat template: that is what speccli bench feeds the
model (`target.tokenizer.tokenize(prompt)`: add_special, no parsing of special tokens; the rewrite
prompt has no special tokens, so llama.cpp's tokenization of it, which parses them, is the same).
Greedy everywhere (bench's default --temp 0; llama.cpp --temp 0 / "temperature": 0), a context of
2048 tokens (bench's default) and the draft on this machine's CPU (llama.cpp: -devd none), the target
entirely on the RPC server (-ngl 99; speccli puts all of it there where this machine has no GPU).
llama.cpp's own speculative defaults are kept: draft-simple drafts a fixed 3 tokens per step
(--spec-draft-n-max 3; `--llama-draft-max N` changes it), ngram-simple looks up a 12-token n-gram and
drafts up to the 48 tokens that followed it (--spec-ngram-simple-size-n 12, -size-m 48). Without an
explicit --spec-type, this llama.cpp does not speculate with a plain -md draft at all (it infers the
type only for MTP/DFlash drafts), hence --spec-type draft-simple on both tools.

Built for the vendored llama.cpp of llama-cpp-python 0.3.36 (RPC protocol 7.0.0), e.g.
    cmake -S <sdist>/vendor/llama.cpp -B /work/llama.cpp-tools -DGGML_NATIVE=OFF -DGGML_AVX=ON
        -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_RPC=ON
        -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF
    nice -n 19 cmake --build /work/llama.cpp-tools -j2 --target llama-speculative-simple llama-server ggml-rpc-server

`--speccli-root` (default: this checkout) is where `python -m speccli` runs (cwd and PYTHONPATH), and
where the built-in prompts are read from. Logs, bench's JSON reports and the prompt file go to
`--workdir` (default: a new directory under /tmp), named at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from delay_proxy import DelayProxy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TARGET = "qwen2.5-coder-1.5b-instruct-q4km"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4km"
REWRITE = "rewrite"
CTX = 2048
SEED = 42
CONFIGURATIONS = ("a", "b", "c", "d-draft", "d-ngram", "e-draft", "e-target")
LABELS = {
    "a": "a) speccli bench, ngram auto",
    "b": "b) speccli bench, model auto",
    "c": "c) speccli bench, ngram+model auto",
    "d-draft": "d) llama-speculative-simple, draft-simple",
    "d-ngram": "d) llama-speculative-simple, ngram-simple",
    "e-draft": "e) llama-server -md, draft-simple",
    "e-target": "e) llama-server, target alone",
}
RPC_BANNER = re.compile(r"speccli rpc-server: serving .* on ([0-9.]+):(\d+) with")
SPEC_SIMPLE_SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s+([0-9.]+) t/s")
SPEC_SIMPLE_COUNTS = re.compile(r"^.*?(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(\d+)\s*$", re.M)


class BenchFailure(RuntimeError):
    pass


@dataclass
class Row:
    """One run of one configuration at one latency."""

    configuration: str
    round: int
    command: str
    tasks: str = REWRITE
    tokens_per_second: Optional[float] = None  # the speculative (or, for e-target, the only) side
    target_alone_tokens_per_second: Optional[float] = None  # bench's own baseline (speccli rows only)
    speedup: Optional[float] = None  # bench's own speedup (speccli rows only)
    rewrite: Optional[dict] = None  # c only: the rewrite task's figures from the same run
    detail: dict = field(default_factory=dict)
    seconds: float = 0.0
    error: Optional[str] = None


# --- subprocesses -----------------------------------------------------------------------------------

def stop(process: Optional[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; reaps it."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace)


def run_logged(argv: list[str], log: Path, timeout: float, env: dict, cwd: Path) -> str:
    """Run to completion (or `timeout`), stdout and stderr into `log`; returns what was logged."""
    with open(log, "w") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=cwd, start_new_session=True)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(process)
            raise BenchFailure(f"timed out after {timeout:g} s (log: {log})") from None
        finally:
            stop(process)
    text = log.read_text(errors="replace")
    if process.returncode != 0:
        tail = "\n".join(text.splitlines()[-8:])
        raise BenchFailure(f"exit {process.returncode} (log: {log}):\n{tail}")
    return text


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RpcServer:
    """`speccli rpc-server --port 0`: its port from its banner on stdout; all it prints drained to a log."""

    def __init__(self, python: str, root: Path, threads: int, env: dict, log: Path, timeout: float) -> None:
        self.argv = [python, "-m", "speccli", "rpc-server", "--host", "127.0.0.1", "--port", "0",
                     "--threads", str(threads)]
        self.log_path = log
        self.log = open(log, "w")
        self.log.write(f"$ {shlex.join(self.argv)}\n")
        self.log.flush()
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        text=True, env=env, cwd=root, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()
        # The banner once it listens; llama.cpp's own "Starting RPC server v7.0.0" lines may come first.
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise BenchFailure(f"speccli rpc-server printed no banner in {timeout:g} s (log: {log})") from None
            if line is None:
                self.close()
                raise BenchFailure(f"speccli rpc-server exited ({self.process.poll()}) before its banner (log: {log})")
            match = RPC_BANNER.search(line)
            if match:
                break
        self.banner = line.strip()
        self.port = int(match.group(2))

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
            self.log.write(line)
            self.log.flush()
        self.lines.put(None)

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        stop(self.process)
        self.drain.join(5)
        self.log.close()


# --- the configurations -----------------------------------------------------------------------------

@dataclass
class Setup:
    args: argparse.Namespace
    root: Path
    env: dict
    workdir: Path
    target_path: Path
    draft_path: Path
    rewrite_prompt: str
    rewrite_file: Path


def speccli_bench(setup: Setup, rpc: str, spec: str, all_tasks: bool, log: Path, report: Path) -> tuple[list[str], Callable]:
    args = setup.args
    draft = [] if spec == "ngram" else ["--draft", args.draft]  # bench refuses a draft model it would not use
    argv = [args.python, "-m", "speccli", "bench", "--target", args.target, *draft,
            "--spec", spec, "--k", "auto", "--n-predict", str(args.n_predict), "--runs", str(args.runs),
            "--warmup", str(args.warmup), "--threads", str(args.threads), "--rpc", rpc, "--json", str(report)]
    if not all_tasks:
        argv += ["--prompts", str(setup.rewrite_file)]

    def run(row: Row) -> None:
        if report.exists():
            report.unlink()  # bench refuses to overwrite nothing but its inputs; a stale report must not be read
        run_logged(argv, log, args.timeout, setup.env, setup.root)
        data = json.loads(report.read_text())
        result = data["results"][0]
        row.detail = {"report": str(report), "label": result["label"], "command": data.get("command")}
        row.tokens_per_second, row.target_alone_tokens_per_second, row.speedup = figures(result["overall"])
        overall = result["overall"]
        row.detail.update(acceptance_rate=overall.get("acceptance_rate"),
                          tokens_per_target_decode=overall.get("tokens_per_target_decode"),
                          mean_draft_length=overall.get("mean_draft_length"))
        row.detail["tasks"] = {
            task["task"]: dict(zip(("tokens_per_second", "target_alone_tokens_per_second", "speedup"), figures(task)),
                               acceptance_rate=task.get("acceptance_rate"))
            for task in result["tasks"]
        }
        if all_tasks:
            row.tasks = ",".join(data["prompts"]["tasks"])
            row.rewrite = row.detail["tasks"].get(REWRITE)

    return argv, run


def figures(summary: dict) -> tuple[Optional[float], Optional[float], Optional[float]]:
    def median(spread: Optional[dict]) -> Optional[float]:
        return None if spread is None else spread["median"]

    return (median(summary["speculative"]["wall_tokens_per_second"]),
            median(summary["baseline"]["wall_tokens_per_second"]), median(summary["speedup"]))


def common_llama_args(setup: Setup, rpc: str) -> list[str]:
    return ["--rpc", rpc, "-m", str(setup.target_path), "-ngl", "99", "-c", str(CTX), "-t", str(setup.args.threads),
            "-fit", "off"]


def draft_args(setup: Setup) -> list[str]:
    extra = ["--spec-draft-n-max", str(setup.args.llama_draft_max)] if setup.args.llama_draft_max is not None else []
    return ["-md", str(setup.draft_path), "-devd", "none", "--spec-type", "draft-simple", *extra]


def speculative_simple(setup: Setup, rpc: str, with_draft: bool, log: Path) -> tuple[list[str], Callable]:
    binary = str(Path(setup.args.llama_bin) / "llama-speculative-simple")
    spec = draft_args(setup) if with_draft else ["--spec-type", "ngram-simple"]
    argv = [binary, *common_llama_args(setup, rpc), *spec, "-n", str(setup.args.n_predict), "--temp", "0",
            "--seed", str(SEED), "-p", setup.rewrite_prompt]

    def run(row: Row) -> None:
        text = run_logged(argv, log, setup.args.timeout, setup.env, setup.root)
        speed = SPEC_SIMPLE_SPEED.findall(text)
        if not speed:
            raise BenchFailure(f"no 'decoded N tokens in T seconds, speed: S t/s' line (log: {log})")
        tokens, seconds, tps = speed[-1]  # ("encoded N tokens ..." is the prompt's, and does not match)
        row.tokens_per_second = float(tps)
        row.detail = {"log": str(log), "decoded_tokens": int(tokens), "decode_seconds": float(seconds),
                      **{name: int(value) for name, value in SPEC_SIMPLE_COUNTS.findall(text)}}
        if row.detail.get("n_drafted"):
            row.detail["acceptance_rate"] = row.detail.get("n_accept", 0) / row.detail["n_drafted"]

    return argv, run


def llama_server(setup: Setup, rpc: str, with_draft: bool, log: Path) -> tuple[list[str], Callable]:
    binary = str(Path(setup.args.llama_bin) / "llama-server")
    port = free_port()
    argv = [binary, *common_llama_args(setup, rpc), *(draft_args(setup) if with_draft else []), "-np", "1",
            "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    body = {"prompt": setup.rewrite_prompt, "n_predict": setup.args.n_predict, "temperature": 0, "seed": SEED,
            "cache_prompt": False}

    def run(row: Row) -> None:
        timeout = setup.args.timeout
        deadline = time.monotonic() + timeout
        with open(log, "w") as out:
            out.write(f"$ {shlex.join(argv)}\n")
            out.flush()
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=setup.env, cwd=setup.root, start_new_session=True)
            try:
                wait_healthy(process, port, deadline, log)
                request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=max(1.0, deadline - time.monotonic())) as reply:
                    answer = json.loads(reply.read())
            except (urllib.error.URLError, TimeoutError, OSError) as error:
                raise BenchFailure(f"llama-server: {error} (log: {log})") from None
            finally:
                stop(process)
        timings = answer.get("timings", {})
        if "predicted_per_second" not in timings:
            raise BenchFailure(f"llama-server: no timings.predicted_per_second in its answer (log: {log})")
        row.tokens_per_second = float(timings["predicted_per_second"])
        row.detail = {"log": str(log), "request": {k: v for k, v in body.items() if k != "prompt"}, "timings": timings,
                      "tokens_predicted": answer.get("tokens_predicted"), "stop_type": answer.get("stop_type")}
        if timings.get("draft_n"):
            row.detail["acceptance_rate"] = timings.get("draft_n_accepted", 0) / timings["draft_n"]

    return argv, run


def wait_healthy(process: subprocess.Popen, port: int, deadline: float, log: Path) -> None:
    """Until GET /health answers 200 (the model loaded, over the link): 503 while loading."""
    while True:
        if process.poll() is not None:
            raise BenchFailure(f"llama-server exited ({process.returncode}) before it was ready (log: {log})")
        if time.monotonic() > deadline:
            raise BenchFailure(f"llama-server not ready before the timeout (log: {log})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)


def make_run(setup: Setup, configuration: str, rpc: str, stem: str) -> tuple[list[str], Callable]:
    log = setup.workdir / f"{stem}.log"
    if configuration in ("a", "b", "c"):
        spec = {"a": "ngram", "b": "model", "c": "ngram+model"}[configuration]
        return speccli_bench(setup, rpc, spec, configuration == "c", log, setup.workdir / f"{stem}.json")
    if configuration.startswith("d-"):
        return speculative_simple(setup, rpc, configuration == "d-draft", log)
    return llama_server(setup, rpc, configuration == "e-draft", log)


# --- one latency ------------------------------------------------------------------------------------

def measure_latency(setup: Setup, one_way_ms: float, configurations: list[str]) -> dict:
    args = setup.args
    tag = f"{one_way_ms:g}ms".replace(".", "p")
    rows: list[Row] = []
    result = {"one_way_ms": one_way_ms, "mbit": args.mbit, "rows": rows}
    with ExitStack() as stack:
        server = RpcServer(args.python, setup.root, args.server_threads, setup.env, setup.workdir / f"rpc-server-{tag}.log",
                           timeout=120)
        stack.callback(server.close)
        proxy = stack.enter_context(DelayProxy(("127.0.0.1", server.port), one_way_ms=one_way_ms, mbit=args.mbit))
        rpc = f"127.0.0.1:{proxy.port}"
        result.update(rpc_server={"command": shlex.join(server.argv), "banner": server.banner},
                      proxy=proxy.describe())
        print(f"## {one_way_ms:g} ms one way: {server.banner}; proxy {proxy.describe()}", file=sys.stderr, flush=True)
        for round_index in range(args.rounds):
            order = configurations if round_index % 2 == 0 else list(reversed(configurations))
            for configuration in order:
                if not server.alive():
                    raise BenchFailure(f"the rpc-server stopped (log: {server.log_path})")
                argv, run = make_run(setup, configuration, rpc, f"{tag}-{configuration}-r{round_index}")
                row = Row(configuration=configuration, round=round_index, command=shlex.join(argv))
                started = time.monotonic()
                print(f"   {LABELS[configuration]} (round {round_index + 1}) ...", file=sys.stderr, end="", flush=True)
                try:
                    run(row)
                except (BenchFailure, ValueError, KeyError, json.JSONDecodeError) as error:
                    row.error = f"{type(error).__name__}: {error}"
                row.seconds = time.monotonic() - started
                tps = "failed" if row.error else f"{fmt(row.tokens_per_second)} tok/s"
                print(f" {tps} ({row.seconds:.0f} s)", file=sys.stderr, flush=True)
                if row.error:
                    print(f"      {row.error}", file=sys.stderr, flush=True)
                rows.append(row)
        result["proxy_stats"] = proxy.stats.as_dict()
    result["rows"] = [asdict(row) for row in rows]
    result["summary"] = summarize(result["rows"])
    return result


def median_of(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def summarize(rows: list[dict]) -> list[dict]:
    """One line per configuration (medians over rounds), and the two references."""
    by = {c: [r for r in rows if r["configuration"] == c and not r["error"]] for c in CONFIGURATIONS}
    errors = {c: [r["error"] for r in rows if r["configuration"] == c and r["error"]] for c in CONFIGURATIONS}
    speccli_alone = median_of(
        [r["target_alone_tokens_per_second"] for c in ("a", "b") for r in by[c]]
        + [(r["rewrite"] or {}).get("target_alone_tokens_per_second") for r in by["c"]]
    )
    llama_alone = median_of(r["tokens_per_second"] for r in by["e-target"])
    lines = []

    def line(name, tasks, tps, alone, own_ratio, runs, error=None):
        lines.append({"configuration": name, "tasks": tasks, "tokens_per_second": tps,
                      "target_alone_same_tool": alone, "ratio_same_tool": own_ratio,
                      "ratio_speccli_target_alone": ratio(tps, speccli_alone) if tasks == REWRITE else None,
                      "runs": runs, "error": error})

    for c in CONFIGURATIONS:
        runs = by[c]
        if not runs and not errors[c]:
            continue
        error = "; ".join(errors[c]) or None
        if c in ("a", "b", "c"):
            line(LABELS[c], runs[0]["tasks"] if runs else (REWRITE if c != "c" else "all"),
                 median_of(r["tokens_per_second"] for r in runs),
                 median_of(r["target_alone_tokens_per_second"] for r in runs),
                 median_of(r["speedup"] for r in runs), len(runs), error)
            if c == "c" and runs:
                line(LABELS[c] + " (its rewrite prompt)", REWRITE,
                     median_of((r["rewrite"] or {}).get("tokens_per_second") for r in runs),
                     median_of((r["rewrite"] or {}).get("target_alone_tokens_per_second") for r in runs),
                     median_of((r["rewrite"] or {}).get("speedup") for r in runs), len(runs))
        else:
            tps = median_of(r["tokens_per_second"] for r in runs)
            line(LABELS[c], REWRITE, tps, llama_alone, ratio(tps, llama_alone), len(runs), error)
    if speccli_alone is not None:
        line("speccli target alone (median of a, b, c's rewrite baselines)", REWRITE, speccli_alone, speccli_alone,
             1.0, sum(len(by[c]) for c in ("a", "b", "c")))
    return lines


# --- output -----------------------------------------------------------------------------------------

def fmt(value: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def render(result: dict) -> str:
    out = [f"### {result['one_way_ms']:g} ms one way" + (f", {result['mbit']:g} Mbit/s" if result["mbit"] else ""),
           "",
           "| configuration | prompt(s) | tok/s | target alone, same tool (tok/s) | ratio to it | "
           "ratio to speccli target alone (rewrite) | runs |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for line in result["summary"]:
        tasks = line["tasks"] if line["tasks"] == REWRITE else f"all ({line['tasks']})"
        tps = "failed" if line["tokens_per_second"] is None and line["error"] else fmt(line["tokens_per_second"])
        out.append(f"| {line['configuration']} | {tasks} | {tps} | {fmt(line['target_alone_same_tool'])} | "
                   f"{fmt(line['ratio_same_tool'], 2, 'x')} | {fmt(line['ratio_speccli_target_alone'], 2, 'x')} | "
                   f"{line['runs']} |")
    out += ["", "speccli rows: tok/s and the target alone are bench's medians, the ratio bench's own speedup "
            "(median of per-run ratios). llama.cpp rows: ratio to llama-server without -md.", ""]
    failed = [line for line in result["summary"] if line["error"]]
    for line in failed:
        out.append(f"- {line['configuration']} failed: {line['error'].splitlines()[0]}")
    if failed:
        out.append("")
    out += ["Commands:", "", "```", f"{result['rpc_server']['command']}",
            f"# proxy: {result['proxy']}"]
    seen = set()
    for row in result["rows"]:
        command = re.sub(r"--port \d+", "--port PORT", row["command"]) if row["configuration"].startswith("e-") else row["command"]
        if command not in seen:
            seen.add(command)
            out.append(shorten_prompt(command))
    out += ["```", ""]
    return "\n".join(out)


def shorten_prompt(command: str) -> str:
    """The -p argument (the rewrite prompt, ~900 characters) shown as <rewrite prompt>."""
    words = shlex.split(command)
    if "-p" in words:
        words[words.index("-p") + 1] = "<rewrite prompt>"
    return shlex.join(words).replace("'<rewrite prompt>'", "<rewrite prompt>")


# --- set-up -----------------------------------------------------------------------------------------

def model_paths(python: str, root: Path, env: dict, names: list[str], timeout: float) -> list[Path]:
    code = ("import sys; from speccli.models.config import load_registry; from speccli.models.resolve import "
            "resolve_models; print('\\n'.join(map(str, resolve_models(sys.argv[1:], load_registry()))))")
    done = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, env=env, cwd=root,
                          timeout=timeout)
    if done.returncode != 0:
        raise BenchFailure(f"cannot resolve {names}: {done.stderr.strip()[-2000:]}")
    return [Path(line) for line in done.stdout.split()]


def rewrite_prompt(root: Path) -> str:
    path = root / "speccli" / "data" / "bench_prompts.jsonl"
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("task") == REWRITE:
                return record["prompt"]
    raise BenchFailure(f"{path}: no {REWRITE!r} prompt")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    floats = lambda text: [float(x) for x in text.split(",") if x.strip()]  # noqa: E731
    parser.add_argument("--one-way-ms", type=floats, default=[0.0, 0.5, 2.0], help="latencies, comma-separated (0,0.5,2)")
    parser.add_argument("--mbit", type=float, default=None, help="bandwidth cap each way, Mbit/s (default: none)")
    parser.add_argument("--rounds", type=int, default=1, help="round-robin passes over the configurations (1)")
    parser.add_argument("--only", default=",".join(CONFIGURATIONS),
                        help=f"configurations to run, comma-separated: {','.join(CONFIGURATIONS)}, d, e (default: all)")
    parser.add_argument("--runs", type=int, default=1, help="speccli bench --runs (1)")
    parser.add_argument("--warmup", type=int, default=1, help="speccli bench --warmup (1)")
    parser.add_argument("--n-predict", type=int, default=64, help="tokens per generation, every tool (64)")
    parser.add_argument("--threads", type=int, default=2, help="threads on the client side, every tool (2)")
    parser.add_argument("--server-threads", type=int, default=2, help="speccli rpc-server --threads (2)")
    parser.add_argument("--target", default=TARGET, help=f"target: registry name or GGUF path ({TARGET})")
    parser.add_argument("--draft", default=DRAFT, help=f"draft: registry name or GGUF path ({DRAFT})")
    parser.add_argument("--llama-bin", default="/work/llama.cpp-tools/bin", help="llama.cpp's binaries")
    parser.add_argument("--llama-draft-max", type=int, default=None,
                        help="--spec-draft-n-max for llama.cpp's draft-simple (default: llama.cpp's own)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to each subprocess (1800)")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs speccli (this one)")
    parser.add_argument("--speccli-root", type=Path, default=ROOT, help="where `python -m speccli` runs (this checkout)")
    parser.add_argument("--workdir", type=Path, default=None, help="logs and reports (default: a new /tmp directory)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = parser.parse_args(argv)
    wanted = []
    for name in (word.strip() for word in args.only.split(",") if word.strip()):
        expanded = [c for c in CONFIGURATIONS if c == name or c.startswith(name + "-")]
        if not expanded:
            parser.error(f"--only {name}: expected one of {', '.join(CONFIGURATIONS)}, d, e")
        wanted += [c for c in expanded if c not in wanted]
    args.configurations = [c for c in CONFIGURATIONS if c in wanted]
    if args.rounds < 1 or args.runs < 1 or args.warmup < 0 or args.n_predict < 1:
        parser.error("--rounds, --runs and --n-predict must be >= 1, --warmup >= 0")
    if any(ms < 0 for ms in args.one_way_ms) or not args.one_way_ms:
        parser.error("--one-way-ms: one or more latencies >= 0")
    return args


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM too: the `finally`s stop every subprocess (each in its own session)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    root = args.speccli_root.resolve()
    needs_llama = [c for c in args.configurations if c[0] in "de"]
    for name in {"d": "llama-speculative-simple", "e": "llama-server"}.items():
        if any(c[0] == name[0] for c in needs_llama) and not (Path(args.llama_bin) / name[1]).is_file():
            print(f"rpc_link: {Path(args.llama_bin) / name[1]}: not found (--llama-bin)", file=sys.stderr)
            return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rpc_link-"))
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    target_path, draft_path = model_paths(args.python, root, env, [args.target, args.draft], timeout=600)
    prompt = rewrite_prompt(root)
    rewrite_file = workdir / "rewrite.jsonl"
    rewrite_file.write_text(json.dumps({"task": REWRITE, "prompt": prompt}) + "\n")
    setup = Setup(args, root, env, workdir, target_path, draft_path, prompt, rewrite_file)

    report = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "models": {"target": str(target_path), "draft": str(draft_path)},
        "prompt": "raw text, no chat template (as speccli bench feeds it); rewrite: the built-in prompt of that task",
        "latencies": [],
    }
    print(f"rpc_link: logs and reports in {workdir}", file=sys.stderr, flush=True)
    status = 0
    try:
        for one_way_ms in args.one_way_ms:
            try:
                result = measure_latency(setup, one_way_ms, args.configurations)
            except BenchFailure as error:
                print(f"rpc_link: {one_way_ms:g} ms: {error}", file=sys.stderr, flush=True)
                report["latencies"].append({"one_way_ms": one_way_ms, "error": str(error)})
                status = 1
                continue
            report["latencies"].append(result)
            print(render(result), flush=True)
            if any(row["error"] for row in result["rows"]):
                status = 1
    except KeyboardInterrupt:
        status = 130
    finally:
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
            print(f"rpc_link: wrote {args.json}", file=sys.stderr)
        print(f"rpc_link: logs and reports in {workdir}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
