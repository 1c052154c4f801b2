"""Benchmark (not a test): a one-shot `speccli chat -p` end to end, as a user times it, with the pair's
cost profile timed by the process against taken up from what an earlier process kept.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/one_shot.py qwen2.5-coder-1.5b [--rounds 3] [-n 128]

Both with what `auto` learnt warm (a first run writes it); "timed" first strips the profile from every
learnt file in speccli's cache (each pair times it again once), so that process times it and writes it
back. Rounds alternate; it
prints each run's wall seconds (load, prompt, reply, exit) and the medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from speccli.remembered.learnt import learnt_files

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Write a Python function that parses a CSV file of orders and returns the total per customer."


def strip_profiles() -> None:
    for path in learnt_files():
        saved = json.loads(path.read_text())
        if saved.pop("costs", None) is not None:
            path.write_text(json.dumps(saved))


def one_shot(pair: str, n: int) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run([str(ROOT / ".venv/bin/speccli"), "chat", pair, "-p", PROMPT, "-n", str(n), "--seed", "3", "--json"],
                          capture_output=True, text=True, check=True)
    return time.perf_counter() - started, json.loads(done.stdout.splitlines()[0])["stats"]["generated_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pair")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=128)
    args = parser.parse_args()
    one_shot(args.pair, args.n)  # what auto learnt, and the profile, written once
    walls: dict[str, list[float]] = {"timed": [], "remembered": []}
    for round_ in range(args.rounds):
        for mode in walls:
            if mode == "timed":
                strip_profiles()
            seconds, tokens = one_shot(args.pair, args.n)
            walls[mode].append(seconds)
            print(f"round {round_ + 1} {mode:10} {seconds:6.2f} s ({tokens} tokens)", flush=True)
    timed, remembered = (statistics.median(walls[mode]) for mode in walls)
    print(f"median: profile timed {timed:.2f} s, remembered {remembered:.2f} s ({timed / remembered:.2f}x)")


if __name__ == "__main__":
    main()
