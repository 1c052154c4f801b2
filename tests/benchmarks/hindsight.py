"""Benchmark (not a test): what a recording allows a draft model's K at best, known in hindsight.

    .venv/bin/python tests/benchmarks/hindsight.py --costs 0.59:1.51,1.96,2.46,3.07 \\
        --recording /tmp/gemma.json --recording /tmp/gemma_heldout.json

Reads recordings made by replay.py (the target's greedy reply to each prompt, and the draft model's greedy
continuation at each of its positions) and prices steps as replay.py does: a step that drafts k tokens
costs k draft decodes (c each) and a verify of k + 1 rows (V), and yields the kept run and one more
token. For each reply it prints:

* the best fixed K of `--k` (what `bench --k auto,4,8,16,24` compares `auto` with, task by task);
* the hindsight optimum: each step's length chosen knowing where the draft will miss (dynamic
  programming over positions), the most any policy could reach on that reply.

Then two things an online policy could go on, pooled over every recording given:

* the draft's first token kept, by the draft's own confidence in it (is a miss foretold?);
* the best of a family of simple length rules (first draft F tokens; after a draft kept whole, M times
  as long; after a miss, twice the run kept), judged by its worst reply against that reply's best
  fixed K.
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Callable

from speccli.drafting.policy import AUTO_MAX_K, VerifyCosts
from speccli.util.sequences import common_prefix_length

from replay import MeasuredCurve, Reply, parse_costs  # a sibling script: this one is run as a script too

MAX_K = AUTO_MAX_K  # the longest draft `auto` makes, and the longest fixed K the replay prices
CONFIDENCE_BANDS = (0.0, 0.1, 0.25, 0.5, 0.75)


def kept_runs(reply: Reply) -> list[int]:
    """At each position, how many of the draft's recorded tokens from there match the reply."""
    return [
        common_prefix_length([token for token, _ in continuation], reply.tokens[t:])
        for t, continuation in enumerate(reply.drafts)
    ]


class Pricing:
    """One reply's steps at fixed costs: drafting k at position t costs k*c + V(k+1), yields kept + 1."""

    def __init__(self, reply: Reply, c: float, verify: VerifyCosts | MeasuredCurve) -> None:
        self.n = len(reply.tokens)
        self.runs = kept_runs(reply)
        self.c, self.verify = c, verify
        # cheapest[t]: the least cost of yielding the reply's tokens from position t on, knowing every run.
        self.cheapest = [0.0] * (self.n + 1)
        for t in range(self.n - 1, -1, -1):
            self.cheapest[t] = min(
                cost + self.cheapest[min(t + yielded, self.n)]
                for yielded, cost in (self.step(t, k) for k in range(min(MAX_K, self.n - t - 1) + 1))
            )

    def step(self, t: int, k: int) -> tuple[int, float]:
        k = min(k, self.n - t - 1, MAX_K)  # replay's limit: the reply's last token is never drafted
        return min(k, self.runs[t]) + 1, k * self.c + self.verify.decode(k + 1)

    def rate(self, choose: Callable[[int, int | None, int | None], int]) -> float:
        """Tokens per unit of cost, each step's length `choose(t, last_drafted, last_kept)`."""
        t, cost, drafted, kept = 0, 0.0, None, None
        while t < self.n:
            k = min(choose(t, drafted, kept), self.n - t - 1, MAX_K)
            yielded, step_cost = self.step(t, k)
            t, cost = t + yielded, cost + step_cost
            if k:
                drafted, kept = k, yielded - 1
        return self.n / cost

    def fixed(self, k: int) -> float:
        return self.rate(lambda t, drafted, kept: k)

    def hindsight(self) -> float:
        return self.n / self.cheapest[0]

def ramp_rule(first: int, growth: int) -> Callable[[int, int | None, int | None], int]:
    def choose(t: int, drafted: int | None, kept: int | None) -> int:
        if drafted is None:
            return first
        return min(MAX_K, growth * drafted) if kept == drafted else max(1, 2 * kept)
    return choose


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--costs", required=True, help="C:V2,V4,V8,V16 (or C:V1,..,V25), as replay.py takes")
    parser.add_argument("--recording", type=Path, action="append", required=True, help="replay.py's JSON (repeatable)")
    parser.add_argument("--k", default="4,8,16,24", help="the fixed K to compare with")
    args = parser.parse_args()
    c, verify = parse_costs(args.costs)
    ks = [int(k) for k in args.k.split(",")]
    replies = [Reply(**fields) for path in args.recording for fields in json.loads(path.read_text())]
    priced = [(reply.task, Pricing(reply, c, verify)) for reply in replies]

    best_fixed = {}
    print(f"{'task':<12}{'best fixed K':>16}{'hindsight':>11}")
    for task, pricing in priced:
        rate, k = max((pricing.fixed(k), k) for k in ks)
        best_fixed[task] = rate
        print(f"{task:<12}{f'K={k} {rate:.3f}':>16}{pricing.hindsight():>11.3f}")

    print("\nthe draft's first token kept, by its confidence in it:")
    bands = {low: [0, 0] for low in CONFIDENCE_BANDS}
    for reply in replies:
        for continuation, truth in zip(reply.drafts, reply.tokens):
            token, confidence = continuation[0]
            band = max(low for low in CONFIDENCE_BANDS if confidence >= low)
            bands[band][0] += 1
            bands[band][1] += token == truth
    highs = CONFIDENCE_BANDS[1:] + (1.0,)
    for (low, (judged, kept)), high in zip(bands.items(), highs):
        print(f"  {low:.2f}-{high:.2f}: {kept} of {judged} kept" + (f" ({kept / judged:.0%})" if judged else ""))

    rules = []
    for first, growth in itertools.product((2, 4, 6, 8, 12, 16, 24), (2, 3, 4, 6, MAX_K)):
        choose = ramp_rule(first, growth)
        ratios = sorted((pricing.rate(choose) / best_fixed[task], task) for task, pricing in priced)
        rules.append((ratios[0], first, growth))
    (worst, task), first, growth = max(rules)
    print(f"\nbest simple rule: first draft {first}, then x{growth} while kept whole, twice the run kept after a "
          f"miss: its worst reply {task} at {worst:.3f} of that reply's best fixed K")


if __name__ == "__main__":
    main()
