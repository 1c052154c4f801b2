"""Benchmark (not a test): the power of each chi-square test against its broken-engine controls.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/chi_square_power.py [TEST_FILE ...]

Runs the chi-square test files (all of them by default) with SPECCLI_CHI2_LOG set, so every p-value
they compute is recorded with its statistic X, degrees of freedom d and draws n
(tests/token_distribution.py), and prints one line per chi-square. A control's X follows a noncentral
chi-square with d degrees of freedom and noncentrality lambda = n * delta, delta its bug's distance per
draw (the sum over cells of (p_broken - p)^2 / p). From one run, delta is bounded below by the lambda at
which X would be that large only 2.5% of the time, and from that bound:
  - "fails again": the chance that the control, at its n, again gives p < 1e-6 (on another machine a
    near-tie may sample other tokens: a control should not pass by luck);
  - "n at 1e-3": the draws an engine test needs to give p < 1e-3 with probability 0.999 under that bug
    (its power at its own n is printed where the control's test id names it);
  - "n for 1e-6": the draws the control needs to fail at p < 1e-6 with probability 0.999.
Passing tests (p > 1e-3) are listed with their p-value.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from scipy import optimize, stats

ROOT = Path(__file__).resolve().parents[2]
FILES = [f"tests/test_{name}.py" for name in ("engine_distribution", "engine_distribution_steps", "generator", "suffix",
                                                "translated", "chat_defaults_distribution", "rpc")]
POWER = 0.999


def lower_noncentrality(statistic: float, degrees: int) -> float:
    """The smallest lambda under which a statistic this large has at least a 2.5% chance."""
    if stats.chi2.sf(statistic, degrees) >= 0.025:
        return 0.0
    return optimize.brentq(lambda lam: stats.ncx2.sf(statistic, degrees, lam) - 0.025, 1e-9, 10 * statistic + 100)


def power(per_draw: float, degrees: int, draws: int, alpha: float) -> float:
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, degrees), degrees, per_draw * draws))


def draws_for(per_draw: float, degrees: int, alpha: float) -> int:
    if per_draw <= 0:
        return 0
    n = 1
    while power(per_draw, degrees, n, alpha) < POWER:
        n = max(n + 1, int(n * 1.05))
    return n


def main() -> None:
    files = sys.argv[1:] or FILES
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as log:
        path = log.name
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *files], cwd=ROOT,
                   env={**os.environ, "SPECCLI_CHI2_LOG": path}, check=False)
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    os.unlink(path)
    print(f"{'test':<100} {'n':>6} {'d':>3} {'X':>8} {'p':>9}  {'fails again':>11} {'n at 1e-3':>9} {'n for 1e-6':>10}")
    for record in records:
        statistic, degrees, draws = record["statistic"], record["degrees"], record["draws"]
        p_value = float(stats.chi2.sf(statistic, degrees))
        line = f"{record['test'][:100]:<100} {draws:>6} {degrees:>3} {statistic:>8.1f} {p_value:>9.2e}"
        if p_value < 1e-3:
            per_draw = lower_noncentrality(statistic, degrees) / draws
            line += (f"  {power(per_draw, degrees, draws, 1e-6):>11.4f} {draws_for(per_draw, degrees, 1e-3):>9}"
                     f" {draws_for(per_draw, degrees, 1e-6):>10}")
        print(line)


if __name__ == "__main__":
    main()
