"""Benchmark (not a test): the suffix source's constants, replayed on recorded replies; nothing is timed.

    .venv/bin/python tests/benchmarks/serve_workload.py --target T.gguf --rounds 1 --speccli alone \\
        --llama '' --json /tmp/workload.json
    .venv/bin/python tests/benchmarks/suffix_replay.py --target T.gguf --recording /tmp/workload.json

The target alone's greedy replies to serve_workload.py's workloads (its --json: the first round of
`speccli alone`) are stepped through by the real SuffixLookup, its store carried from request to
request as serve carries it: each step proposes up to 25 tokens (K fixed; the walk's own stops decide
the length), keeps them up to the first that differs from the recorded reply, and one token more (the
target's). The prompts are rendered by the target's chat template, as serve renders them; a reply's
tokens are its recorded text tokenized again (a reply's own tokenization may differ in a few places).

Figures for the context's lookup alone (`ngram`), for rules choosing between the context's match and
the store's (`RULES`), and for each value tried of each constant (the others at their defaults):
tokens a step yields,
draft tokens verified per token kept (what a verify pays for nothing), and the speedup over the target
alone at fixed verify costs V(n), in target 1-row decodes, interpolated from V(2), V(4), V(8), V(16):
the CPU profiles of replay.py (Gemma F32 1.24,1.52,1.83,2.55; Qwen 1.5B 1.48,1.59,3.15,4.08) and a
GPU-like one (1.01,1.03,1.07,1.15). The lookups' own time is left out (suffix_store.py measures it).
"under auto" replays `ngram` and `suffix` with the real K policy instead of K fixed (replay.py's
replay), at the same profiles: replies recorded at a temperature are judged there as their steps would
be (a certain proposal's token is kept with the probability that the target yields it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import speccli  # noqa: F401  first: llama.cpp's library mapped before numpy (docs/gpu.md)
import numpy as np

from speccli.chat.template import chat_format_for, tokenize_rendered
from speccli.drafting import suffix
from speccli.drafting.ngram import NgramLookup
from speccli.drafting.policy import VerifyCosts
from speccli.llama.tokenizer import load_vocab_only

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import Reply, replay as auto_replay  # noqa: E402
from serve_workload import WORKLOADS  # noqa: E402

LIMIT = 25
PROFILES = {"gemma-cpu": (1.24, 1.52, 1.83, 2.55), "qwen-cpu": (1.48, 1.59, 3.15, 4.08), "gpu-like": (1.01, 1.03, 1.07, 1.15)}
TRIED = {
    "MIN_SHARE": (0.0, 0.05, 0.1, 0.2, 0.4, 0.7),
    "HEAD_TOKENS": (0, 4, 16, 64),
    "WALKED": (1, 4, 16, 64),
    "MAX_CANDIDATES": (16, 64, 256, 1024),
}


class Choosing(suffix.SuffixLookup):
    """SuffixLookup with another rule for which match drafts, the context's (`here`) or the store's."""

    def __init__(self, store_drafts) -> None:
        super().__init__()
        self.store_drafts = store_drafts


RULES = {
    "the longer match, the context's on a tie": suffix.SuffixLookup.store_drafts,  # SuffixLookup's own
    "the store's on a tie": lambda here, earlier: earlier.length >= here.length,
    "the store's unless the context's is 2 longer": lambda here, earlier: earlier.length + 2 > here.length,
    "the store's always": lambda here, earlier: True,
    "the longer proposal": lambda here, earlier: len(earlier.following) > len(here.following),
}


def verify_cost(n_rows: int, profile: tuple[float, ...]) -> float:
    return float(np.interp(n_rows, (1, 2, 4, 8, 16, 32), (1.0, *profile, profile[3] + 2 * (profile[3] - profile[2]))))


def replay(conversations: list[tuple[list[int], list[int]]], drafter: NgramLookup | None = None) -> list[tuple[int, int]]:
    """(draft tokens verified, tokens kept) per step, over every reply in order, one store for all."""
    drafter = suffix.SuffixLookup() if drafter is None else drafter
    steps = []
    for prompt, reply in conversations:
        drafter.new_conversation()
        context = list(prompt)
        drafter.sync(context)
        done = 0
        while done < len(reply):
            limit = min(LIMIT, len(reply) - done - 1)
            match = drafter.match(context, limit) if limit > 0 else None
            proposed = match.following[:limit] if match is not None else []  # a fixed K drafts all it may
            matched = 0
            while matched < len(proposed) and proposed[matched] == reply[done + matched]:
                matched += 1
            kept = reply[done : done + matched + 1]
            drafter.kept(kept)
            context += kept
            done += len(kept)
            steps.append((len(proposed), len(kept)))
    return steps


def auto_speedups(conversations: list[tuple[list[int], list[int]]]) -> dict[tuple[str, str], float]:
    """(profile, spec) -> the speedup of `ngram` and `suffix` under `auto` (replay.py's replay: the real
    policy, one store for every reply). A reply sampled at a temperature is judged as its steps would
    be: a lookup's token is kept with the probability that the target yields it there."""
    # An empty reply (the target stopped at once) has no step to price.
    replies = [Reply("w", prompt, reply, [[] for _ in reply]) for prompt, reply in conversations if reply]
    return {
        (name, spec): statistics.mean(
            auto_replay(replies, spec, "auto", 1, 0.0, VerifyCosts({1: 1.0, **dict(zip((2, 4, 8, 16), profile))}), remember=True)["w"]
        )
        for name, profile in PROFILES.items()
        for spec in ("ngram", "suffix")
    }


def figures(steps: list[tuple[int, int]]) -> str:
    kept = sum(k for _, k in steps)
    wasted = sum(p - (k - 1) for p, k in steps)
    speedups = [kept / sum(verify_cost(p + 1, profile) for p, _ in steps) for profile in PROFILES.values()]
    return f"{kept / len(steps):5.2f} tok/step  {wasted / kept:5.2f} wasted/tok  " + "  ".join(
        f"{name} {s:4.2f}×" for name, s in zip(PROFILES, speedups))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--recording", type=Path, required=True, help="serve_workload.py's --json")
    args = parser.parse_args()
    recorded = json.loads(args.recording.read_text())
    tokenizer = load_vocab_only(args.target)
    chat_format = chat_format_for(tokenizer)[0]
    workloads = {}
    for name, make in WORKLOADS.items():
        runs = recorded.get(f"speccli alone {name}")
        if not runs:
            continue
        replies = [text for _, _, text in runs[0]]
        prompts = [tokenize_rendered(tokenizer, chat_format, chat_format.render(r["messages"])) for r in make()]
        workloads[name] = [(p, tokenizer.tokenize(text, False, False)) for p, text in zip(prompts, replies)]
    defaults = {name: getattr(suffix, name) for name in TRIED}
    for name, conversations in workloads.items():
        print(f"\n{name}: {len(conversations)} replies, {sum(len(r) for _, r in conversations)} tokens")
        print(f"  {'ngram (context only)':20}{figures(replay(conversations, NgramLookup()))}")
        auto = "  ".join(f"{name} {spec} {speedup:4.2f}×" for (name, spec), speedup in auto_speedups(conversations).items())
        print(f"  {'under auto':20}{auto}")
        for rule, store_drafts in RULES.items():
            print(f"  {rule:46} {figures(replay(conversations, Choosing(store_drafts)))}")
        for constant, values in TRIED.items():
            for value in values:
                setattr(suffix, constant, value)
                mark = " (default)" if value == defaults[constant] else ""
                print(f"  {constant:14} {value:<6}{figures(replay(conversations))}{mark}")
            setattr(suffix, constant, defaults[constant])


if __name__ == "__main__":
    main()
