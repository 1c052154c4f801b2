"""Benchmark (not a test): what the HTTP layer of `speccli serve` costs, its time to first token, and
a load test's throughput and latency percentiles.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/server_overhead.py            # Gemma pair
    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/server_overhead.py --tiny     # tiny test models

Overhead: the same greedy generation (same prompt, same drafter, fixed K) driven directly through a
Generator, as chat drives it, and requested from the server with the openai client, alternated run by
run (and which goes first) so drift on a shared machine hits both; tokens/s is generated tokens over the wall-clock time of
the whole call on each side. The server gets its own copy of the models, so neither side disturbs
the other's KV cache; both repeat one prompt, so both reuse the cached prompt alike.
Time to first token: a streamed request, from sending it to the first content chunk, against the
first token event of a direct generation. Load: 8 clients x 4 requests at once, greedy.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import openai

from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.core.stats import TokenEvent
from speccli.drafting.policy import FixedK
from speccli.drafting.specs import make_drafter
from speccli.llama.model import LoadOptions, Model
from speccli.models.pair import PairRequest, resolve
from speccli.server.launch import ServeSettings, build_service, serving_in_thread

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def pair_paths(tiny: bool, directory: Path) -> tuple[Path, Path, int]:
    if tiny:
        from tests.tiny_gguf import write_related_pair

        target, draft = write_related_pair(directory, target_layers=8, draft_layers=2, eps=0.05)
        return target, draft, 3
    resolved = resolve(PairRequest("gemma3-270m"))
    return resolved.target_path, resolved.draft_path, resolved.k


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny models instead of the Gemma pair")
    parser.add_argument("--tokens", type=int, default=128, help="max tokens per generation")
    parser.add_argument("--runs", type=int, default=5, help="measured runs per side")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-load", action="store_true", help="skip the load test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        target_path, draft_path, k = pair_paths(args.tiny, Path(scratch))
        options = LoadOptions(n_ctx=2048, n_threads=args.threads)
        direct_target, direct_draft, served_target, served_draft = (
            stack.enter_context(Model(path, options)) for path in (target_path, draft_path, target_path, draft_path)
        )
        greedy = SamplingParams(temperature=0)
        generator = Generator(direct_target, make_drafter("model", direct_draft, direct_target), greedy, FixedK(k))
        prompt = direct_target.tokenizer.tokenize(PROMPT, True, True)
        limits = GenerationLimits(args.tokens)
        service = build_service("bench", served_target, served_draft, ServeSettings(spec="model", k=k, max_waiting=8))
        url = stack.enter_context(serving_in_thread(service))
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        request = {"model": "bench", "prompt": PROMPT, "max_tokens": args.tokens, "temperature": 0}

        def direct() -> tuple[int, float, float]:
            started = time.perf_counter()
            first, count = None, 0
            for event in generator.generate(prompt, limits):
                if isinstance(event, TokenEvent):
                    count += 1
                    first = first or time.perf_counter() - started
            return count, time.perf_counter() - started, first

        def served() -> tuple[int, float]:
            started = time.perf_counter()
            reply = client.completions.create(**request)
            return reply.usage.completion_tokens, time.perf_counter() - started

        def served_first_token() -> float:
            started = time.perf_counter()
            with client.completions.create(**request, stream=True) as stream:
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].text:
                        first = time.perf_counter() - started
                        break
            return first

        direct(), served(), served_first_token()  # warm-up: first decodes, the cached prompt
        ratios, direct_speeds, served_speeds, direct_firsts, served_firsts = [], [], [], [], []
        for run in range(args.runs):
            if run % 2:  # which side goes first alternates too
                n_served, seconds_served = served()
                n_direct, seconds_direct, first_direct = direct()
            else:
                n_direct, seconds_direct, first_direct = direct()
                n_served, seconds_served = served()
            assert n_direct == n_served, (n_direct, n_served)
            direct_speeds.append(n_direct / seconds_direct)
            served_speeds.append(n_served / seconds_served)
            ratios.append(served_speeds[-1] / direct_speeds[-1])
            direct_firsts.append(first_direct)
            served_firsts.append(served_first_token())
        print(f"models: {'tiny test pair' if args.tiny else 'gemma3-270m (f32 target, Q4_K_M draft)'}, k={k}, "
              f"{n_direct} tokens per generation, {args.runs} runs per side")
        print(f"direct  tok/s median {statistics.median(direct_speeds):8.1f}")
        print(f"served  tok/s median {statistics.median(served_speeds):8.1f}")
        print(f"HTTP overhead (1 - median served/direct): {(1 - statistics.median(ratios)) * 100:+.2f}%")
        print(f"time to first token: direct {statistics.median(direct_firsts) * 1000:.1f} ms, "
              f"served (stream) {statistics.median(served_firsts) * 1000:.1f} ms")

        if args.no_load:
            return

        def one_client(client_id: int) -> list[tuple[float, int]]:
            own = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
            results = []
            for n in range(4):
                started = time.perf_counter()
                reply = own.completions.create(**{**request, "prompt": f"{PROMPT} (reader {client_id}, part {n})",
                                                  "max_tokens": args.tokens // 2})
                results.append((time.perf_counter() - started, reply.usage.completion_tokens))
            return results

        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            results = [result for per_client in pool.map(one_client, range(8)) for result in per_client]
        wall = time.perf_counter() - started
        latencies = [seconds for seconds, _ in results]
        tokens = sum(count for _, count in results)
        print(f"load 8 clients x 4 requests: {len(results)} completed in {wall:.2f} s, {tokens / wall:.1f} tok/s, "
              f"latency p50 {percentile(latencies, 0.5):.2f} s, p90 {percentile(latencies, 0.9):.2f} s, "
              f"p99 {percentile(latencies, 0.99):.2f} s")


if __name__ == "__main__":
    main()
