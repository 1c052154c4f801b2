"""Benchmark (not a test): what a speculative configuration costs over the target alone where it drafts
nothing, and where that cost goes.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/plain_step_overhead.py qwen2.5-coder-1.5b --rounds 5

One process loads the pair once; each round generates the same greedy reply (the built-in `story`
prompt, or --task) as the target alone, then through `--spec model` with a policy that drafts nothing
(`never`: the seam's cost alone), then with `--spec model --k auto` (what a user gets where drafting
does not pay), in a rotating order, so drift on a shared machine hits each alike. For each it prints
tokens/s (over the generation's own time) and the median seconds per step of the target's decode and
of everything else (drafting, the policy, verification and bookkeeping), each against the target
alone's. The target and the draft are the same loaded models throughout, so their output buffers and
threads are the same in every configuration.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from speccli.bench.prompts import load_prompt_set
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.core.seam import Plan
from speccli.core.stats import DoneEvent, StepEvent
from speccli.drafting.policy import AutoK, FixedK
from speccli.drafting.specs import make_drafter
from speccli.llama.model import LoadOptions, Model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pair_files import HELP as PAIR_HELP, pair_files  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


class NeverDraft(FixedK):
    """A policy that plans no draft, ever: a speculative configuration reduced to its seam."""

    def __init__(self) -> None:
        super().__init__(0)
        self.name = "never"

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        return Plan(0)


def generate(generator: Generator, prompt: list[int], n: int) -> tuple[float, list[StepEvent]]:
    generator.reset()
    steps: list[StepEvent] = []
    started = time.perf_counter()
    done = None
    for event in generator.generate(prompt, GenerationLimits(max_tokens=n)):
        if isinstance(event, StepEvent):
            steps.append(event)
        elif isinstance(event, DoneEvent):
            done = event
    elapsed = time.perf_counter() - started - done.stats.prefill_seconds
    return done.stats.generated / elapsed, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pair", help=PAIR_HELP)
    parser.add_argument("--task", default="story")
    parser.add_argument("-n", "--n-predict", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    files = pair_files(args.pair)
    options = LoadOptions(n_ctx=2048)
    with Model(files.target_path, options) as target, Model(files.draft_path, options) as draft:
        prompt_text = next(p.prompt for p in load_prompt_set(None).prompts if p.task == args.task)
        prompt = target.tokenizer.tokenize(prompt_text)
        auto = AutoK()  # one policy across rounds, as bench keeps one across its runs
        configurations = {
            "target alone": lambda: Generator(target, None, GREEDY),
            "model, never": lambda: Generator(target, make_drafter("model", draft, target), GREEDY, NeverDraft()),
            "model, auto": lambda: Generator(target, make_drafter("model", draft, target), GREEDY, auto),
        }
        generate(configurations["model, auto"](), prompt, 16)  # warm-up: auto profiles its costs here
        rates: dict[str, list[float]] = {name: [] for name in configurations}
        target_step: dict[str, list[float]] = {name: [] for name in configurations}
        other_step: dict[str, list[float]] = {name: [] for name in configurations}
        drafted_steps: dict[str, int] = {name: 0 for name in configurations}
        names = list(configurations)
        for round_ in range(args.rounds):
            for name in names[round_ % 3:] + names[: round_ % 3]:
                rate, steps = generate(configurations[name](), prompt, args.n_predict)
                print(f"round {round_ + 1}: {name:<13} {rate:6.2f} tok/s, {len(steps)} steps", flush=True)
                rates[name].append(rate)
                plain = [step for step in steps if not step.drafted]
                target_step[name] += [step.target_seconds for step in plain]
                other_step[name] += [step.draft_seconds + step.other_seconds for step in plain]
                drafted_steps[name] += len(steps) - len(plain)
        base_rate = statistics.median(rates["target alone"])
        base_target = statistics.median(target_step["target alone"])
        print(f"{args.pair}, {args.task}, {args.n_predict} tokens, {args.rounds} rounds (medians; ratios to the target alone)")
        print(f"{'configuration':<14} {'tok/s':>7} {'ratio':>6} {'target ms/plain step':>21} {'other ms/plain step':>20} {'drafted steps':>14}")
        for name in names:
            rate, t, o = statistics.median(rates[name]), statistics.median(target_step[name]), statistics.median(other_step[name])
            print(f"{name:<14} {rate:>7.2f} {rate / base_rate:>6.3f} {1000 * t:>12.2f} ({t / base_target:.3f}) {1000 * o:>20.3f} {drafted_steps[name]:>14}")


if __name__ == "__main__":
    main()
