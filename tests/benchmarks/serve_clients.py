"""Benchmark (not a test): many clients at once through `speccli serve --parallel N` and `llama-server -np N`.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/serve_clients.py --target T.gguf [--draft D.gguf]
        [--clients 1,2,4] [--requests 12] [--temp 0] [--rounds 3] [--speccli default,off,default@1]
        [--llama alone,draft:4,draft:8,draft:16,ngram-mod] [--long 4000]

A mixed workload (chat, code rewrite, JSON extraction; 128 new tokens each), the same token ids to both
servers at /v1/completions, streamed. For each number of clients C, each configuration answers
`--requests` requests through C client threads (each sends its next request when its last one ends) on
a fresh server with C slots. speccli's configurations: `default` (the pair's spec, K auto), `off`
(drafting off in every request), a --spec value, and CONF@S (that configuration with S slots, whatever
the clients: @1 is serve as it was before slots). llama-server's: `alone`, `draft:N` (its draft model
at --spec-draft-n-max N) and `ngram-mod`. Configurations alternate round by round. Figures: completion
tokens over the wall time of all requests (aggregate tok/s), median over rounds; the p95 of the gaps
between streamed chunks; at T 0, how many replies equal the one-slot configuration's, and why the others
part (`explain`).
`--long N`: a further run per configuration in which a prompt of about N tokens arrives while C clients
stream; it prints their p95 gap with and without it.

llama-server is the vendored tree's (see serve_workload.py), with the same context per slot and threads.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai

from speccli.drafting.registry import uses_draft_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_workload import ROOT, Prompts, Server, free_port, json_workload  # noqa: E402

CHAT = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain to a ten-year-old why the sky is blue.",
        "Give me five tips for keeping a sourdough starter alive.",
        "Describe a walk through a city market at dawn."]
CODE = ["Rewrite this Python function to use a list comprehension and add type hints:\n\n"
        "def evens(numbers):\n    result = []\n    for n in numbers:\n        if n % 2 == 0:\n"
        "            result.append(n)\n    return result\n",
        "Rewrite this JavaScript function with async/await instead of promise chains:\n\n"
        "function load(url) {\n  return fetch(url).then(r => r.json()).then(data => {\n"
        "    console.log(data.items.length);\n    return data.items;\n  });\n}\n",
        "Rewrite this Python class as a dataclass and keep its behaviour:\n\n"
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n"
        "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n"]


def mixed_workload(n: int) -> list[list[dict]]:
    extraction = [request["messages"] for request in json_workload()]
    kinds = [[[{"role": "user", "content": text}] for text in CHAT], [[{"role": "user", "content": text}] for text in CODE],
             extraction]
    return [kinds[i % 3][i // 3 % len(kinds[i % 3])] for i in range(n)]


def speccli_server(args, configuration: str, slots: int) -> tuple[Server, dict]:
    spec, _, given = configuration.partition("@")
    slots = int(given) if given else slots
    extra = {"speculative": {"enabled": False}} if spec == "off" else {}
    spec_args = [] if spec in ("default", "off") else ["--spec", spec]
    port = free_port()
    drafts = spec in ("default", "off") or uses_draft_model(spec)  # a lookup alone is refused a draft model
    draft = ["--draft", str(args.draft), "--ngl-draft", str(args.ngl)] if args.draft and drafts else []
    return Server([str(ROOT / ".venv/bin/speccli"), "serve", "--target", str(args.target), "--ngl", str(args.ngl), *draft, *spec_args,
                   "--ctx", str(args.ctx * slots), "--parallel", str(slots), "--threads", str(args.threads),
                   "--queue", "64", "--port", str(port)], port,
                  env={**os.environ, "SPECCLI_COLD_START": "1"}), extra  # each server from the priors


def llama_server(args, configuration: str, slots: int) -> tuple[Server, dict]:
    port = free_port()
    kind, _, n_max = configuration.partition(":")
    spec_args = [] if configuration == "alone" else ["--spec-type", kind] if not n_max else \
        ["-md", str(args.draft), "-ngld", str(args.ngl), "--spec-draft-n-max", n_max]
    return Server([str(Path(args.llama_bin) / "llama-server"), "-m", str(args.target), "-c", str(args.ctx * slots),
                   "-ngl", str(args.ngl), "-t", str(args.threads), "-np", str(slots), "--host", "127.0.0.1", "--port", str(port), "--no-webui",
                   *spec_args], port), {}


def stream_one(client: openai.OpenAI, model: str, prompt: list[int], args, seed: int, extra: dict) -> tuple[int, list[float], str]:
    """(completion tokens, the times of its streamed chunks, the text)."""
    times, tokens, text = [time.perf_counter()], 0, []
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=args.temp, top_p=0.95, seed=seed,
        stop=list(args.prompts.format.stop) or None, stream=True, stream_options={"include_usage": True},
        extra_body={"top_k": 40, "min_p": 0.05, **extra})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
            text.append(chunk.choices[0].text)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return tokens, times, "".join(text)


def run(server: Server, extra: dict, prompts: list[list[int]], clients: int, args, long_prompt: list[int] | None = None):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0, timeout=1200)
    model = client.models.list().data[0].id
    # Unmeasured: each slot's first request pays one-time costs (speccli times the pair's decode sizes once).
    warm = [threading.Thread(target=stream_one, args=(client, model, prompts[0][:32], args, 0, extra)) for _ in range(clients)]
    [thread.start() for thread in warm]
    [thread.join() for thread in warm]
    queue = list(enumerate(prompts))
    lock = threading.Lock()
    done: list[tuple[int, list[float], str]] = []
    texts: dict[int, str] = {}

    def client_loop() -> None:
        while True:
            with lock:
                if not queue:
                    return
                seed, prompt = queue.pop(0)
            result = stream_one(client, model, prompt, args, seed, extra)
            with lock:
                done.append(result)
                texts[seed] = result[2]

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    started = time.perf_counter()
    [thread.start() for thread in threads]
    if long_prompt is not None:
        time.sleep(2.0)
        stream_one(client, model, long_prompt, args, 0, extra)
    [thread.join() for thread in threads]
    wall = time.perf_counter() - started
    rows = rows_per_decode(server.port)
    if rows is not None:
        print(f"    target rows per decode (the warm-up and prompts included): {rows:.1f}", file=sys.stderr)
    gaps = sorted(b - a for _, times, _ in done for a, b in zip(times[1:], times[2:]))
    p95 = gaps[int(0.95 * (len(gaps) - 1))] if gaps else float("nan")
    return sum(tokens for tokens, _, _ in done) / wall, p95, [texts[i] for i in range(len(prompts))]


def rows_per_decode(port: int) -> float | None:
    """speccli's /metrics: the target's rows per llama_decode so far (None from another server)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return None
    totals = {name: float(value) for name, value in re.findall(r'^speccli_(llama_decode\w*_total)\{model="target"\} (\S+)$', text, re.M)}
    decodes = totals.get("llama_decodes_total")
    return totals["llama_decode_rows_total"] / decodes if decodes else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--clients", default="1,2,4")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=1024, help="context per slot")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--ngl", type=int, default=0, help="layers of each model offloaded, both servers (99: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speccli", default="default,off,default@1")
    parser.add_argument("--llama", default="alone,draft:4,draft:8,draft:16,ngram-mod")
    parser.add_argument("--llama-bin", default="/work/llama.cpp-tools/bin")
    parser.add_argument("--long", type=int, default=0, help="also: a prompt of about N tokens arriving mid-run")
    args = parser.parse_args()
    args.prompts = Prompts(args.target)
    prompts = [args.prompts.ids(messages) for messages in mixed_workload(args.requests)]
    long_prompt = None
    if args.long:
        filler = args.prompts.ids([{"role": "user", "content": "Summarise this log:\n" + "step ok; " * (args.long // 3)}])
        long_prompt = filler[: args.long]
    configurations = [("speccli", c) for c in args.speccli.split(",") if c] + \
                     [("llama", c) for c in args.llama.split(",") if c and (args.draft or not c.startswith("draft"))]
    print(f"target {args.target.name}, draft {args.draft.name if args.draft else '-'}, T {args.temp}, "
          f"{args.requests} requests of {args.max_tokens} tokens, context {args.ctx} a slot, {args.rounds} rounds")
    for clients in [int(c) for c in args.clients.split(",")]:
        figures: dict[tuple[str, str], list[tuple[float, float, list[str]]]] = {c: [] for c in configurations}
        longs: dict[tuple[str, str], list[float]] = {c: [] for c in configurations}
        for round_ in range(args.rounds):
            order = configurations if round_ % 2 == 0 else configurations[::-1]
            for tool, configuration in order:
                launch = speccli_server if tool == "speccli" else llama_server
                server, extra = launch(args, configuration, clients)
                with server:
                    figures[tool, configuration].append(run(server, extra, prompts, clients, args))
                    if long_prompt is not None:
                        longs[tool, configuration].append(run(server, extra, prompts, clients, args, long_prompt)[1])
                print(f"  [{clients} clients, round {round_ + 1}] {tool} {configuration}: "
                      f"{figures[tool, configuration][-1][0]:.2f} tok/s", file=sys.stderr, flush=True)
        print(f"\n{clients} client(s):")
        print(f"  {'tool':8} {'configuration':16} {'tok/s':>7} {'p95 gap s':>10}" + ("  p95 with a long prompt" if long_prompt else ""))
        best_llama = max((statistics.median(r for r, _, _ in runs) for (tool, _), runs in figures.items() if tool == "llama"),
                         default=None)
        for (tool, configuration), runs in figures.items():
            rate = statistics.median(r for r, _, _ in runs)
            p95 = statistics.median(g for _, g, _ in runs)
            versus = f"  {rate / best_llama:.2f}x llama-server's best" if best_llama and tool == "speccli" else ""
            long = f"  {statistics.median(longs[tool, configuration]):.3f}" if long_prompt else ""
            print(f"  {tool:8} {configuration:16} {rate:7.2f} {p95:10.3f}{long}{versus}")
        if args.temp == 0:  # greedy: each speccli configuration's replies against the same one's with one slot
            for (tool, configuration), runs in figures.items():
                one_slot = configuration.partition("@")[0] + "@1"
                alone = figures.get((tool, one_slot))
                if tool == "speccli" and alone and configuration != one_slot:
                    pairs = [(i, a, b) for run, single in zip(runs, alone) for i, (a, b) in enumerate(zip(run[2], single[2]))]
                    print(f"  {configuration}: {sum(a == b for _, a, b in pairs)} of {len(pairs)} replies equal to one slot's")
                    explain(args, prompts, [(i, b, a) for i, a, b in pairs if a != b])


def explain(args, prompts: list[list[int]], partings: list[tuple[int, str, str]]) -> None:
    """Each greedy reply that parts from its one-slot run, re-tokenized, at the first token where they
    part: the target alone's top-two logit gap there against llama.cpp's batched-vs-single difference
    (speccli/core/parting.py). Loads the target here, once the servers are gone."""
    if not partings:
        return
    from speccli.core.parting import find_parting
    from speccli.llama.model import LoadOptions, Model

    with Model(args.target, LoadOptions(n_ctx=4096, n_threads=args.threads)) as target:
        for i, single, together in partings:
            ids = [target.tokenizer.tokenize(text.encode(), add_special=False) for text in (single, together)]
            parting = find_parting(target, prompts[i], ids[0], ids[1], k=8)
            if parting is None:
                print(f"    request {i}: the same tokens, re-tokenized")
                continue
            print(f"    request {i} parts at token {parting.index} (one slot {parting.reference_token}, beside others "
                  f"{parting.candidate_token}): the target alone's top-two gap {parting.top_two_gap:.3f}, the batched-"
                  f"vs-single difference up to {parting.tolerance:.3f}: " + ("a near-tie" if parting.near_tie else "NOT a near-tie"))


if __name__ == "__main__":
    main()
