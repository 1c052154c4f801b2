"""Benchmark (not a test): multi-request workloads through `speccli serve` and llama.cpp's `llama-server`,
where the `suffix` source drafts from the server's earlier replies.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/serve_workload.py --target T.gguf [--draft D.gguf]
        [--temp 0.8] [--rounds 3] [--only json,regenerate,agent] [--speccli alone,ngram,suffix,suffix@remembered,suffix+model]
        [--llama alone,ngram-mod]

Workloads, each a list of chat requests sent one after another to a fresh server (the store starts
empty, as a newly started `speccli serve` without --remember; a configuration SPEC@remembered runs
SPEC with --remember, after a first server process has answered another variant of the workload: the
same kind of requests with other facts, or other seeds):
  json        one system prompt with a fixed JSON schema, over 24 short generated biographies;
  regenerate  one story request 6 times (temperature --temp, a seed per request): figures for the first
              and for the rest;
  agent       12 steps of a loop in one action format, each prompt carrying the steps so far;
  structured  bench's 8 extraction prompts under docs/examples/extract.schema.json (speccli gets it as
              `response_format`, llama-server as its `json_schema` field: both on /v1/completions).
Each configuration runs each workload once per round, in an order that alternates round by round.
Each request goes to /v1/completions as the token ids speccli's chat would send the target (`Prompts`),
and is timed end to end by the client (the openai package); tokens are the response's
completion_tokens. Figures: tokens per second over a workload's requests, median over rounds, and the
ratio to the same tool's target alone in the same round (median of the rounds' ratios).

llama-server is the vendored tree's (`--llama-bin`, default /work/llama.cpp-tools/bin; built as
tests/benchmarks/loop_overhead.py says, target `llama-server`), run with the same context, threads and
sampling; `ngram-mod` is its cross-request n-gram pool (`--spec-type ngram-mod`), the closest thing
llama.cpp has to this store; `draft:N` is its draft model (--draft) at `--spec-draft-n-max N`.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]

NAMES = ["Ada Lovelace", "Bo Chen", "Carla Diaz", "Dmitri Ivanov", "Emeka Obi", "Fatima Khan", "Gustav Berg",
         "Hana Sato", "Ivan Petrov", "Julia Rossi", "Kofi Mensah", "Lena Novak", "Marco Silva", "Nora Lind",
         "Omar Haddad", "Priya Nair", "Quinn Walsh", "Rosa Costa", "Sven Olsen", "Tara Singh", "Umar Farouk",
         "Vera Kuznetsova", "Wei Zhang", "Yara Haddad"]
CITIES = ["Lisbon", "Osaka", "Nairobi", "Toronto", "Bergen", "Lyon", "Pune", "Cusco", "Tallinn", "Perth"]
ROLES = ["data engineer", "nurse", "architect", "teacher", "chef", "pilot", "lawyer", "designer"]
COMPANIES = ["Northwind", "Acme Corp", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries", "Wayne Enterprises"]
SCHEMA = ('Extract the person described by the user as JSON with exactly these keys: "name" (string), '
          '"company" (string), "role" (string), "city" (string), "email" (string), "years" (integer). '
          'Reply with the JSON object only.')
AGENT_SYSTEM = ("You are an agent that answers questions with tools. Each reply is exactly two lines:\n"
                "Thought: <one short sentence>\nAction: <tool>[<argument>]\n"
                "Tools: search[query], lookup[term], calculate[expression], finish[answer].")
QUESTIONS = ["What is the population of the capital of Norway?", "How tall is the tallest building in Osaka?",
             "What year was the university in Lyon founded?", "How far is Perth from Sydney in km?"]


def json_workload(variant: int = 0) -> list[dict]:
    requests = []
    for i, name in enumerate(NAMES):
        first, j = name.split()[0].lower(), i + 3 * variant  # another variant: the same people, other facts
        bio = (f"{name} has worked for {j % 7 + 2} years as a {ROLES[j % len(ROLES)]} at {COMPANIES[j % len(COMPANIES)]} "
               f"in {CITIES[j % len(CITIES)]}. Write to {first}@{COMPANIES[j % len(COMPANIES)].split()[0].lower()}.com.")
        requests.append({"messages": [{"role": "system", "content": SCHEMA}, {"role": "user", "content": bio}]})
    return requests


def regenerate_workload(variant: int = 0) -> list[dict]:
    message = [{"role": "user", "content": "Tell a short story about a lighthouse keeper who finds a message in a bottle."}]
    return [{"messages": message, "seed": 100 + 10 * variant + i} for i in range(6)]


def agent_workload(variant: int = 0) -> list[dict]:
    """12 steps over 4 questions; each step's prompt has the earlier steps with made-up observations
    (the replies themselves are not fed back: every configuration then sends the same prompts)."""
    requests = []
    for q, question in enumerate(QUESTIONS):
        history = [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": question}]
        for step in range(3):
            requests.append({"messages": list(history)})
            action = ["search", "lookup", "calculate"][step]
            history += [{"role": "assistant", "content": f"Thought: I need step {step + 1} for this.\nAction: {action}[{question[:30]}]"},
                        {"role": "user", "content": f"Observation: result {q}.{step}: {1000 + 37 * (q + variant) * (step + 1)}"}]
    return requests


def structured_workload(variant: int = 0) -> list[dict]:
    schema = json.loads((ROOT / "docs/examples/extract.schema.json").read_text())
    lines = (ROOT / "speccli/data/bench_structured.jsonl").read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines[variant:] + lines[:variant]]
    return [{"messages": [{"role": "user", "content": prompt}], "schema": schema} for prompt in prompts]


WORKLOADS = {"json": json_workload, "regenerate": regenerate_workload, "agent": agent_workload,
             "structured": structured_workload}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Server:
    argv: list[str]
    port: int
    env: dict | None = None
    process: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.process = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, cwd=ROOT, env=self.env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{shlex.join(self.argv)} exited: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.25)
        raise SystemExit(f"{shlex.join(self.argv)}: not ready in 300 s")

    def __exit__(self, *exc_info) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def speccli_server(args, spec: str, cache: str | None = None) -> Server:
    """`spec` is `alone`, a --spec, or SPEC@remembered: that spec with --remember and its store in `cache`."""
    port = free_port()
    spec, _, remembered = spec.partition("@")
    draft = ["--draft", str(args.draft)] if args.draft and "model" in spec else []
    spec_args = ["--spec", "ngram" if spec == "alone" else spec] + (["--remember"] if remembered else [])
    return Server([str(ROOT / ".venv/bin/speccli"), "serve", "--target", str(args.target), *draft, *spec_args,
                   "--ctx", str(args.ctx), "--threads", str(args.threads), "--port", str(port)], port,
                  env={**os.environ, "XDG_CACHE_HOME": cache} if cache else None)


def llama_server(args, spec: str) -> Server:
    port = free_port()
    kind, _, n_max = spec.partition(":")
    spec_args = [] if spec == "alone" else ["--spec-type", kind] if not n_max else \
        ["--spec-type", "draft-simple", "-md", str(args.draft), "--spec-draft-n-max", n_max]
    return Server([str(Path(args.llama_bin) / "llama-server"), "-m", str(args.target), "-c", str(args.ctx),
                   "-t", str(args.threads), "-np", "1", "--host", "127.0.0.1", "--port", str(port), "--no-webui",
                   *spec_args], port)


class Prompts:
    """Each request's messages as the token ids speccli's chat renders them to (the target's template, or
    a plain transcript where it has none), and the stop strings that go with them: both servers get the
    same ids at /v1/completions (llama-server's chat endpoint falls back to another template than
    speccli's for a GGUF without one, so its chat requests would be other prompts)."""

    def __init__(self, target: Path) -> None:
        from speccli.chat.template import chat_format_for, tokenize_rendered
        from speccli.llama.tokenizer import load_vocab_only

        self.tokenizer = load_vocab_only(target)
        self.format = chat_format_for(self.tokenizer)[0]
        self._tokenize = tokenize_rendered

    def ids(self, messages: list[dict]) -> list[int]:
        return self._tokenize(self.tokenizer, self.format, self.format.render(messages))


def run_workload(server: Server, requests: list[dict], args, alone: bool = False) -> list[tuple[int, float, str]]:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id  # speccli serves the target by its name, and no other
    # chat's sampling settings, which are also llama-server's defaults, given to both
    extra = {"top_k": 40, "min_p": 0.05, **({"speculative": {"enabled": False}} if alone else {})}
    def schema_of(request: dict) -> dict:  # llama-server's field, and OpenAI's
        return {"json_schema": request["schema"], "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": request["schema"]}}} if "schema" in request else {}

    # Unmeasured: a server's first request pays one-time costs (speccli's `auto` times the pair's decode
    # sizes once; both warm caches; speccli reads the vocabulary for grammars once), which a long-running
    # server pays once in all.
    client.completions.create(model=model, prompt=args.prompts.ids([{"role": "user", "content": "Hello"}]), max_tokens=8,
                              temperature=0, extra_body={**extra, **schema_of(requests[0])})
    done = []
    for request in requests:
        started = time.perf_counter()
        schema = schema_of(request)
        reply = client.completions.create(model=model, prompt=args.prompts.ids(request["messages"]), max_tokens=args.max_tokens,
                                          temperature=args.temp, top_p=0.95, seed=request.get("seed", 0),
                                          stop=list(args.prompts.format.stop) or None, extra_body={**extra, **schema})
        done.append((reply.usage.completion_tokens, time.perf_counter() - started, reply.choices[0].text))
    return done


def rate(done: list[tuple[int, float, str]]) -> float:
    return sum(tokens for tokens, _, _ in done) / sum(seconds for _, seconds, _ in done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--speccli", default="alone,ngram,suffix", help="speccli configurations: alone or a --spec")
    parser.add_argument("--llama", default="alone,ngram-mod", help="llama-server configurations: alone or a --spec-type ('' for none)")
    parser.add_argument("--llama-bin", default="/work/llama.cpp-tools/bin")
    parser.add_argument("--json", type=Path, help="also write every request's figures and reply here")
    args = parser.parse_args()
    args.prompts = Prompts(args.target)
    configurations = [("speccli", spec) for spec in args.speccli.split(",") if spec]
    if (Path(args.llama_bin) / "llama-server").exists():
        configurations += [("llama", spec) for spec in args.llama.split(",") if spec]
    else:
        print(f"no llama-server in {args.llama_bin}: its rows are left out", file=sys.stderr)
    workloads = {name: WORKLOADS[name]() for name in args.only.split(",")}
    figures: dict[tuple[str, str, str], list[list[tuple[int, float, str]]]] = {}
    for round_ in range(args.rounds):
        order = configurations if round_ % 2 == 0 else configurations[::-1]
        for tool, spec in order:
            for name, requests in workloads.items():
                if tool == "llama":
                    with llama_server(args, spec) as server:
                        done = run_workload(server, requests, args)
                else:
                    with tempfile.TemporaryDirectory() as cache:
                        if spec.endswith("@remembered"):  # a first process remembers other requests of this kind
                            with speccli_server(args, spec, cache) as server:
                                run_workload(server, WORKLOADS[name](variant=1), args)
                        with speccli_server(args, spec, cache) as server:
                            done = run_workload(server, requests, args, alone=spec == "alone")
                figures.setdefault((tool, spec, name), []).append(done)
                print(f"round {round_ + 1} {tool} {spec:12} {name:10} {rate(done):6.1f} tok/s "
                      f"({sum(t for t, _, _ in done)} tokens)", file=sys.stderr, flush=True)
        if args.json:  # after each round: a run stopped early keeps the rounds it finished
            args.json.write_text(json.dumps({" ".join(key): runs for key, runs in figures.items()}, indent=1))
    print(f"\ntarget {args.target.name}, temperature {args.temp:g}, max_tokens {args.max_tokens}, {args.rounds} rounds; "
          "tok/s median over rounds, × = median of per-round ratios to the same tool's target alone")
    for name in workloads:
        print(f"\n{name}")
        for tool, spec in configurations:
            runs = figures[(tool, spec, name)]
            alone = figures.get((tool, "alone", name))
            per_reply = statistics.median(sum(seconds for _, seconds, _ in r) / len(r) for r in runs)
            line = f"  {tool:8} {spec:14} {statistics.median(rate(r) for r in runs):7.1f} tok/s {per_reply:6.2f} s/reply"
            if alone and spec != "alone":
                line += f"  {statistics.median(rate(r) / rate(a) for r, a in zip(runs, alone)):5.2f}×"
                if name == "regenerate":
                    later = statistics.median(rate(r[1:]) / rate(a[1:]) for r, a in zip(runs, alone))
                    line += f"  (requests 2-6: {later:.2f}×)"
            print(line)
        llama_best = max((spec for tool, spec in configurations if tool == "llama"),  # the fastest per reply
                         key=lambda spec: -statistics.median(sum(x[1] for x in r) for r in figures[("llama", spec, name)]), default=None)
        for tool, spec in configurations:
            if llama_best and tool == "speccli" and spec != "alone":
                pairs = list(zip(figures[(tool, spec, name)], figures[("llama", llama_best, name)]))
                ratio = statistics.median(rate(s) / rate(l) for s, l in pairs)
                in_time = statistics.median(sum(x[1] for x in l) / sum(x[1] for x in s) for s, l in pairs)
                print(f"  speccli {spec} / llama-server's best ({llama_best}): {ratio:.2f}× in tok/s, {in_time:.2f}× in time")


if __name__ == "__main__":
    main()
