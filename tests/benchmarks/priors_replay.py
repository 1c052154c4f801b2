"""Benchmark (not a test): what starting from the priors costs a reply, replayed at fixed costs.

    .venv/bin/python tests/benchmarks/priors_replay.py --recordings DIR

Each recorded reply of judges.py's recordings is replayed alone twice under `auto`: from the priors (a
policy that has seen nothing, as a first run on a machine or one after `speccli remembered --clear`),
and after the same reply once (the estimates it left, as a process that recalls the learnt file of an
earlier run on that prompt). Prints, per recording, judge costs and spec, the median and the lowest
ratio of the first to the second over the recording's tasks: the cold start's cost in the estimates
alone, with nothing timed (docs/results.md, the priors row).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from judges import SPECS, judges  # noqa: E402
from replay import replay  # noqa: E402

from speccli.validation import AUTO_K  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", type=Path, required=True, help="folder of replay.py's recordings")
    args = parser.parse_args()
    for judge in judges(args.recordings):
        for spec in SPECS:
            ratios = []
            for reply in judge.replies:
                cold, warm = (replay([reply], spec, AUTO_K, 1, judge.c, judge.verify, (), judge.catch_up, warmup,
                                     judge.host, False, judge.draft_first, judge.n_predict)[reply.task][0]
                              for warmup in (0, 1))
                ratios.append(cold / warm)
            print(f"{judge.recording} {judge.cost} {spec}: from the priors {statistics.median(ratios):.3f} of warm "
                  f"(median over {len(ratios)} tasks; lowest {min(ratios):.3f})", flush=True)


if __name__ == "__main__":
    main()
