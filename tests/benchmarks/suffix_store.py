"""The suffix source's store: its memory and load time at 1M tokens, and a step's cost (indexing the
kept tokens, looking the context's end up in the context and in the store) beside the lookup's at a
16k-token context. Text: the bench's prompts, tokenized by a real tokenizer and repeated with small
changes, so that matches are as long and as frequent as in real replies.

    .venv/bin/python tests/benchmarks/suffix_store.py [--model GGUF] [--store-tokens 1000000]
"""
from __future__ import annotations

import argparse
import json
import tracemalloc
import statistics
import tempfile
import time
from pathlib import Path

import speccli  # noqa: F401  first: llama.cpp's library mapped before numpy (docs/gpu.md)
import numpy as np

from speccli.drafting.ngram import NgramLookup
from speccli.drafting.suffix import SuffixLookup
from speccli.remembered.stores import RememberedStore
from speccli.llama.tokenizer import load_vocab_only
from speccli.models.resolve import resolve_models
from speccli.models.config import load_registry


def corpus(model: Path, n_tokens: int) -> list[int]:
    prompts = [json.loads(line)["prompt"] for line in Path("speccli/data/bench_prompts.jsonl").read_text().splitlines() if line.strip()]
    with load_vocab_only(model) as tokenizer:
        pieces = [tokenizer.tokenize(prompt, False) for prompt in prompts]
    rng = np.random.default_rng(0)
    tokens: list[int] = []
    while len(tokens) < n_tokens:
        piece = list(pieces[rng.integers(len(pieces))])
        for _ in range(3):  # a few edits, as replies to similar requests differ
            piece[rng.integers(len(piece))] = int(rng.integers(1000))
        tokens += piece
    return tokens[:n_tokens]


def rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory (or, with VmHWM, its peak so far), from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF whose tokenizer to use (default: the Qwen 1.5B target)")
    parser.add_argument("--store-tokens", type=int, default=1_000_000)
    parser.add_argument("--context", type=int, default=16_000)
    args = parser.parse_args()
    model = args.model or resolve_models(["qwen2.5-coder-1.5b-instruct-q4km"], load_registry(), fetch=False, quiet=True)[0]
    text = corpus(model, args.store_tokens + args.context)
    rss_before = rss_mib()
    tracemalloc.start()
    store = RememberedStore(2 * args.store_tokens, "v")
    started = time.perf_counter()
    for start in range(0, args.store_tokens, 400):  # replies of 400 tokens after 16 of their prompt
        store.begin(text[max(start - 16, 0):start])
        store.extend(text[start:start + 400])
    fill = time.perf_counter() - started
    held, peak = (size / 2**20 for size in tracemalloc.get_traced_memory())
    tracemalloc.stop()
    rss_grew = rss_mib() - rss_before
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "store.suffix"
        store.save(path)
        started = time.perf_counter()
        loaded, problem = RememberedStore.load(path, "v", 1 << 20, 2 * args.store_tokens)
        load = time.perf_counter() - started
        assert problem is None
        size = path.stat().st_size / 2**20
    print(f"store of {store.n_tokens:,} tokens: built from replies in {fill:.2f} s, {held:.0f} MiB held ({peak:.0f} MiB at peak), the process's RSS {rss_grew:+.0f} MiB "
          f"(peak RSS {rss_mib('VmHWM'):.0f} MiB, the text it was built from included); "
          f"file {size:.1f} MiB, loaded in {load:.2f} s")
    context = text[args.store_tokens:]
    for name, drafter in (("ngram", NgramLookup()), ("suffix", SuffixLookup(loaded))):
        drafter.sync(context[: args.context // 2])
        times = []
        for end in range(args.context // 2, args.context):
            started = time.perf_counter()
            drafter.match(context[:end], 24)
            times.append(time.perf_counter() - started)
        times.sort()
        print(f"{name:7} one step at a {args.context:,}-token context: median {statistics.median(times) * 1e3:.3f} ms, "
              f"p99 {times[int(len(times) * 0.99)] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
