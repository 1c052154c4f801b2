"""Benchmark (not a test): every replay judge of RESULTS.md in one run, compared with a saved run.

    .venv/bin/python tests/benchmarks/judges.py --recordings DIR --save after.json --against before.json

A policy change is judged by the fixed-cost replay (RESULTS.md, "How a rule is judged"): each
recording in DIR replayed at each of its judges' costs, for each spec under `auto`, in seconds, with
nothing timed. The recordings are replay.py's, made once per machine (about 4 minutes each here):

    replay.py gemma3-270m        --recording DIR/gemma48.json -n 48 ...
    replay.py gemma3-270m        --recording DIR/gemmaheld.json -n 64 --prompts tests/benchmarks/heldout_prompts.jsonl ...
    replay.py qwen2.5-coder-1.5b --recording DIR/qwen48.json -n 48 ...
    replay.py gemma3-270m        --recording DIR/gemma_agent.json -n 64 --workload agent ...
    replay.py TARGET.gguf,DRAFT.gguf --recording DIR/device.json -n 128 ...   (.ci/device/check.py models --scale device)

A recording missing from DIR is left out, said once. Prints each judge's geometric mean over its tasks
and, against a saved run, the change and the task that moved most down.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Iterator, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import Reply, parse_costs, replay  # noqa: E402

from speccli.validation import parse_k  # noqa: E402

# name: (--costs, --catch-up, --host, --draft-first), as RESULTS.md's judges
COSTS = {
    "gemma cpu": ("0.476:1.28,1.49,1.77,2.34", (0.23, 0.097), (0.0, 0.0), 0.0),
    "qwen cpu": ("0.479:1.48,1.59,3.15,4.08", (0.55, 0.178), (0.0, 0.0), 0.0),
    "gemma gpu": ("0.05:1.01,1.03,1.07,1.15", (0.23, 0.097), (0.0, 0.0), 0.0),
    "qwen gpu": ("0.05:1.01,1.03,1.07,1.15", (0.55, 0.178), (0.0, 0.0), 0.0),
    "h200": ("0.298:1.38,1.56,1.66,1.82", (1.0, 0.05), (0.035, 0.15), 0.18),
    "device h200": ("0.25:1.37,1.56,1.65,1.85", (1.0, 0.05), (0.035, 0.15), 0.18),
    "device nofixed": ("0.298:1.38,1.56,1.66,1.82", (1.0, 0.05), (0.035, 0.15), 0.0),
}
# recording: (its judges' costs, tokens a reply, rounds, warm-up replies, remember: as serve)
JUDGES = {
    "gemma48": (("gemma cpu", "gemma gpu", "h200"), 48, 3, 1, False),
    "gemmaheld": (("gemma cpu", "h200"), 64, 3, 1, False),
    "qwen48": (("qwen cpu", "qwen gpu"), 48, 3, 1, False),
    "gemma_agent": (("gemma cpu", "h200"), 64, 1, 0, True),
    "device": (("device h200", "device nofixed"), 128, 2, 1, False),
}
SPECS = ("suffix+model", "model", "ngram")


class Judge(NamedTuple):
    """One recording at one judge's costs: replay's arguments but the spec and K."""

    recording: str
    cost: str
    replies: list[Reply]
    n_predict: int
    rounds: int
    warmup: int
    remember: bool
    c: float
    verify: object  # parse_costs's curve
    catch_up: tuple[float, float]
    host: tuple[float, float]
    draft_first: float


def judges(recordings: Path) -> Iterator[Judge]:
    """Each recording in the folder at each of its judges' costs; one missing is said once and left out."""
    for recording, (costs, n_predict, rounds, warmup, remember) in JUDGES.items():
        path = recordings / f"{recording}.json"
        if not path.exists():
            print(f"{path}: missing, left out (replay.py makes it: see this file's docstring)")
            continue
        replies = [Reply(**fields) for fields in json.loads(path.read_text())]
        for cost in costs:
            verify_costs, catch_up, host, draft_first = COSTS[cost]
            c, verify = parse_costs(verify_costs)
            yield Judge(recording, cost, replies, n_predict, rounds, warmup, remember, c, verify, catch_up, host,
                        draft_first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", type=Path, required=True, help="folder of replay.py's recordings")
    parser.add_argument("--k", default="auto", help="comma list of K, each with each spec")
    parser.add_argument("--save", type=Path, help="write this run's figures here (JSON)")
    parser.add_argument("--against", type=Path, help="a saved run to compare with")
    args = parser.parse_args()
    before = json.loads(args.against.read_text()) if args.against else {}
    figures = {}
    for judge in judges(args.recordings):
        for spec in SPECS:
            for k in args.k.split(","):
                speedups = replay(judge.replies, spec, parse_k(k), judge.rounds, judge.c, judge.verify, (),
                                  judge.catch_up, judge.warmup, judge.host, judge.remember, judge.draft_first,
                                  judge.n_predict)
                tasks = {task: statistics.mean(values) for task, values in speedups.items()}
                name = f"{judge.recording} {judge.cost} {spec} {k}"
                figures[name] = {"geomean": statistics.geometric_mean(tasks.values()), "tasks": tasks}
                print(describe(name, figures[name], before.get(name)))
    if args.save:
        args.save.write_text(json.dumps(figures, indent=1))


def describe(name: str, now: dict, then: dict | None) -> str:
    line = f"{name:<36} {now['geomean']:.3f}"
    if then is None:
        return line
    change, task = min((now["tasks"][task] / then["tasks"][task] - 1, task) for task in now["tasks"] if task in then["tasks"])
    return line + f"  before {then['geomean']:.3f} ({now['geomean'] / then['geomean'] - 1:+.2%}; {task} {change:+.1%})"


if __name__ == "__main__":
    main()
