"""Benchmark (not a test): what a pair's draft model pays to take in n tokens it skipped, in one batched
decode, against one drafted token (a one-token decode with its logits row), as ModelDrafter catches up
and as `auto` prices it. Prints the medians and the line A + B*n (in drafted tokens) that replay.py's
`--catch-up A,B` takes:

    .venv/bin/python tests/benchmarks/catch_up_costs.py qwen2.5-coder-1.5b
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from speccli.llama.model import LoadOptions, Model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pair_files import pair_files  # noqa: E402

SIZES = (2, 4, 8, 16, 24)
PROMPT = list(range(1000, 1200))  # any tokens: a decode's cost does not depend on them
REPEATS = 7


def timed(model: Model, tokens: list[int], n_logit_rows: int) -> float:
    start = model.n_past
    began = time.perf_counter()
    model.decode(tokens, n_logit_rows=n_logit_rows)
    seconds = time.perf_counter() - began
    model.truncate(start)
    return seconds


def main(pair: str) -> None:
    files = pair_files(pair)
    with Model(files.draft_path, LoadOptions(n_ctx=1024)) as draft:
        draft.decode(PROMPT, n_logit_rows=0)
        timed(draft, [PROMPT[0]], 1)  # the first decode pays set-up
        token = statistics.median(timed(draft, [PROMPT[0]], 1) for _ in range(REPEATS))
        catch_up = {n: statistics.median(timed(draft, PROMPT[:n], 0) for _ in range(REPEATS)) for n in SIZES}
    print(f"one drafted token: {token * 1000:.1f} ms")
    for n, seconds in catch_up.items():
        print(f"catch-up of {n:2d} tokens: {seconds * 1000:6.1f} ms = {seconds / token:.2f} drafted tokens")
    low, high = SIZES[0], SIZES[-1]
    per_token = (catch_up[high] - catch_up[low]) / (high - low) / token
    print(f"--catch-up {catch_up[low] / token - per_token * low:.2f},{per_token:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
