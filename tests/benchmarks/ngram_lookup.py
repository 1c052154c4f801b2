"""Benchmark (not a test): the n-gram drafter's cost per step and its memory as the context grows.

    .venv/bin/python tests/benchmarks/ngram_lookup.py

Simulates generation over code-like token streams: each step indexes the accepted tokens and looks
up a proposal, as the generator does. Prints the median and 99th-percentile time per step at
several context lengths, and the index's memory (tracemalloc) at the largest.
"""
from __future__ import annotations

import statistics
import time
import tracemalloc

import numpy as np

from speccli.drafting.ngram import NgramLookup


def token_stream(length: int, seed: int = 0) -> list[int]:
    """Text-like ids: a Zipf vocabulary of 150k, with spans copied from earlier (as code rewriting does)."""
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    while len(tokens) < length:
        if tokens and rng.random() < 0.3:
            start = int(rng.integers(len(tokens)))
            tokens += tokens[start : start + int(rng.integers(4, 40))]
        else:
            tokens += [int(x) % 150_000 for x in rng.zipf(1.3, size=int(rng.integers(5, 30)))]
    return tokens[:length]


def measure(context_tokens: int, steps: int = 2000) -> tuple[float, float]:
    stream = token_stream(context_tokens + steps * 4)
    drafter = NgramLookup()
    drafter.sync(stream[:context_tokens])
    rng = np.random.default_rng(0)
    seconds, end = [], context_tokens
    for _ in range(steps):
        end += int(rng.integers(1, 5))  # 1-4 tokens accepted per step
        began = time.perf_counter()
        drafter.match(stream[:end], 32)
        seconds.append(time.perf_counter() - began)
    seconds.sort()
    return statistics.median(seconds), seconds[int(0.99 * len(seconds))]


def main() -> None:
    for length in (1_000, 4_000, 16_000):
        median, p99 = measure(length)
        print(f"context {length:>6} tokens: {median * 1e3:.3f} ms median, {p99 * 1e3:.3f} ms p99 per step (index + lookup)")
    tracemalloc.start()
    drafter = NgramLookup()
    drafter.sync(token_stream(16_000))
    current, _ = tracemalloc.get_traced_memory()
    print(f"index memory at 16,000 tokens: {current / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
