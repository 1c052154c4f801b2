"""Benchmark (not a test): each rule of `auto` removed in turn, replayed on every judge of judges.py.

    .venv/bin/python tests/benchmarks/rules_removed.py --recordings DIR

Each rule is replaced by the simplest code without it (a text patch, below), in a copy of the speccli
package, and judges.py replays every recording at its judges' costs with that copy; the code as it is
runs first. Prints one markdown row a rule (RESULTS.md, *Each rule removed*): the cell (recording,
costs, spec) whose geometric mean fell most, the one that rose most, the task that fell most, and how
many cells fell by more than 1%. A patch that no longer applies stops the run, naming the rule.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POLICY, PLANNER = "drafting/policy.py", "drafting/planner.py"
NGRAM, ACCEPTANCE = "drafting/ngram.py", "drafting/acceptance.py"

# rule: [(file under speccli/, the text with the rule, the text without it)]
RULES = {
    "a draft model's ramp (each reply from RAMP_START, doubling)": [
        (POLICY, "state.schedule.unramped = fastest(rates) > RAMP_START", "state.schedule.unramped = True")],
    "a lookup's ramp": [
        (POLICY, "    def ramp(self, lookup_ramps: Sequence[int]) -> int:\n        if self.last_kept is None:",
         "    def ramp(self, lookup_ramps: Sequence[int]) -> int:\n        return AUTO_MAX_K\n        if self.last_kept is None:")],
    "a lookup's ramp grown by what its copy kept": [
        (POLICY, "lookup_ramps[min(self.copied, len(lookup_ramps) - 1)]", "lookup_ramps[0]")],
    "an unramped model's draft one longer after one kept whole (`explore`)": [
        (POLICY, "        if self.unramped and k and self.last_kept_whole:\n            return max(k, min(self.last_drafted + 1, longest))\n", "")],
    "a ramped model's cautious choice past its ramp": [
        (POLICY, "        cautious = range(ramp, min(best, max(ramp, RAMP_START)) + 1)\n"
                 "        return next((k for k in cautious if rates[k] > rates[0]), cautious[-1])",
         "        return fastest(rates[: ramp + 1])")],
    "re-checks, all": [
        (POLICY, "recheck = state.schedule.probe_due() and self._recheck_affordable(state, catch_up, intake)", "recheck = False")],
    "a draft model re-checked where a reply first asks it": [
        (POLICY, "        if not self.asked_in_reply:\n            return self.idle_replies >= min(self.backoff(), MEMORY) - 1\n", "")],
    "re-checks only where what the model skipped is cheap to take in": [
        (POLICY, "return not state.acceptance.judged_at or cheap", "return True")],
    "no re-check where only the prompt's intake rules the model out": [
        (POLICY, "if recheck and intake and not k:", "if False:")],
    "the re-checks' back-off (doubling while they fail)": [
        (POLICY, "return 2 ** min(self.failed_probes, 8)", "return 1")],
    "a re-check fades earlier evidence (`RECHECK_CARRY`)": [
        (POLICY, "state.acceptance.fade(RECHECK_CARRY)", "pass")],
    "a longer memory for an unramped draft model (`LONG_RECENCY`)": [
        (POLICY, "state.acceptance.recency = LONG_RECENCY if state.schedule.unramped else RECENCY", "pass")],
    "the per-reply lookup scale": [
        (POLICY, "acceptance[0] *= min(1.0, self.lookup_kept / self.lookup_expected)", "pass")],
    "the prompt's intake priced (C(P)/N)": [
        (POLICY, "intake = self._intake_per_token(state, owed_prompt, available) if owed_prompt else 0.0", "intake = 0.0")],
    "the intake spread by the replies' lengths (N: the draft's room instead)": [
        (POLICY, "remaining = min(available + 1, sum(longer) / len(longer)) if longer else available + 1", "remaining = available + 1")],
    "the intake spread by the model's share of the reply": [
        (POLICY, "share = state.schedule.share if isinstance(state.schedule, ModelSchedule) else 1.0", "share = 1.0")],
    "a catch-up priced (C(m))": [
        (POLICY, "state.cost.taking_in(catch_up) * level\n", "0.0\n")],
    "a lookup judged where it does not draft": [
        (POLICY, "        if draft.judged is not None:\n", "        if False:\n")],
    "a match's history in its key (once / same / varied)": [
        (NGRAM, '"same" if bool((tokens[candidates + 1] == tokens[end]).all()) else "varied"', '"once"')],
    "a match's length in its key (one bucket)": [
        (NGRAM, 'MATCH_LENGTHS = ((12, "12+"), (6, "6-11"), (3, "3-5"), (1, "1-2"))', 'MATCH_LENGTHS = ((1, "any"),)')],
    "a_j shrunk towards a_(j-1) (towards the pooled rate instead)": [
        (ACCEPTANCE, "shrunk(self.kept_at[position], self.judged_at[position], previous)",
         "shrunk(self.kept_at[position], self.judged_at[position], pooled)")],
    "the model's draft taken over by the lookup": [
        (PLANNER, "may_take_over = self.lookup is not None and policy.plan(model.name, limit).rate is not None", "may_take_over = False")],
    "the model drafting where it promises more than the lookup (else the lookup, where it has a draft)": [
        (PLANNER, "if drafted and not _promises_more(model_rate, drafted, policy):", "if drafted:")],
}


def patched(source: str, old: str, new: str, rule: str) -> str:
    if source.count(old) != 1:
        raise SystemExit(f"{rule}: its patch no longer applies ({old.strip()[:60]!r} found {source.count(old)} times)")
    return source.replace(old, new)


def judged(recordings: Path, rule: str | None, scratch: Path) -> dict:
    """judges.py's figures with `rule` removed (None: the code as it is), from a copy of the package."""
    package = scratch / "speccli"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(REPO / "speccli", package, ignore=shutil.ignore_patterns("__pycache__"))
    for file, old, new in RULES.get(rule, []):
        path = package / file
        path.write_text(patched(path.read_text(), old, new, rule))
    saved = scratch / "figures.json"
    subprocess.run([sys.executable, str(REPO / "tests/benchmarks/judges.py"), "--recordings", str(recordings),
                    "--save", str(saved)], env={"PYTHONPATH": str(scratch), "PATH": "/usr/bin:/bin"},
                   check=True, capture_output=True)
    return json.loads(saved.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", type=Path, required=True, help="folder of replay.py's recordings")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        base = judged(args.recordings, None, Path(scratch))
        print("| rule removed | cell, worst | cell, best | task, worst | cells below −1% |\n|---|---|---|---|---|")
        for rule in RULES:
            figures = judged(args.recordings, rule, Path(scratch))
            cells = sorted((figures[name]["geomean"] / base[name]["geomean"] - 1, name) for name in base)
            task = min((figures[name]["tasks"][t] / base[name]["tasks"][t] - 1, name, t)
                       for name in base for t in base[name]["tasks"])
            below = sum(change < -0.01 for change, _ in cells)
            print(f"| {rule} | {cells[0][0]:+.1%} {cells[0][1]} | {cells[-1][0]:+.1%} {cells[-1][1]} | "
                  f"{task[0]:+.1%} {task[1]} `{task[2]}` | {below} |", flush=True)


if __name__ == "__main__":
    main()
