"""Benchmark (not a test): draft sources compared under one fixed cost model, free of timing noise.

    .venv/bin/python tests/benchmarks/fixed_cost_model.py gemma3-270m --spec ngram+model,model,ngram --rounds 3

On this shared 2-core machine a single task's wall-clock speedup moves by 5-15% between runs, more
than most changes to a draft policy. This generates the built-in bench prompts greedily (one generator
and K policy per spec, kept across the prompts as `speccli bench` keeps them) and prices the steps each
run took with costs profiled once at the start, in target 1-token decodes: c per token a draft model
decoded (a lookup's continuation of its draft costs none) and V(n) per verify of n rows. Generated
tokens per unit of that cost is the speedup those steps would give at exactly those costs. `auto`'s
choices still follow the run's own timings, so rounds differ a little: their mean is printed. A draft
model's catch-up on context it skipped is not priced; its share of the step time is printed apart.

The profile itself moves between runs (one Gemma run profiled V(4) at 1.46, the next at 1.49, and
modeled speedups moved by 10% with it): to compare two versions of the code, pin the costs the first
run printed with `--costs C:V2,V4,V8,V16`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from speccli.bench.prompts import load_prompt_set
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.core.stats import DoneEvent, StepEvent
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import Planner
from speccli.drafting.policy import AutoK, VerifyCosts
from speccli.drafting.specs import make_drafter
from speccli.llama.model import LoadOptions, Model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pair_files import HELP as PAIR_HELP, pair_files  # noqa: E402

from replay import parse_costs  # a sibling script: this one is run as a script too

GREEDY = SamplingParams(temperature=0.0)


def profiled_costs(target: Model, draft: Model, prompt: list[int]) -> tuple[float, VerifyCosts]:
    """(c, V) in target 1-token decodes, from a generator's own calibration on `prompt`."""
    policy = AutoK()
    generator = Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, policy)
    for _ in generator.generate(prompt, GenerationLimits(max_tokens=1)):
        pass
    one_token = policy.verify.decode_seconds[1]  # the profile, as measured (the curve's shape at level 1)
    shape = VerifyCosts({n: seconds / one_token for n, seconds in policy.verify.decode_seconds.items()})
    return policy.keys["model"].token_seconds / one_token, shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pair", help=PAIR_HELP)
    parser.add_argument("--spec", default="ngram+model,model,ngram")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", "--n-predict", type=int, default=48)
    parser.add_argument("--costs", help="C:V2,V4,V8,V16 (target 1-token decodes) instead of profiling them")
    args = parser.parse_args()
    specs = args.spec.split(",")
    files = pair_files(args.pair)
    options = LoadOptions(n_ctx=2048)
    with Model(files.target_path, options) as target, Model(files.draft_path, options) as draft:
        prompts = [(p.task, target.tokenizer.tokenize(p.prompt)) for p in load_prompt_set(None).prompts]
        if args.costs:
            c, verify = parse_costs(args.costs)
        else:
            c, verify = profiled_costs(target, draft, prompts[0][1])
        print(f"{args.pair}: --costs {c:.3f}:" + ",".join(f"{verify.decode(n):.2f}" for n in (2, 4, 8, 16)))
        speedups: dict[tuple[str, str], list[float]] = {}
        for spec in specs:
            target.reset(), draft.reset()
            generator = Generator(target, make_drafter(spec, draft if "model" in spec else None, target), GREEDY, AutoK())
            catch_up = step_time = 0.0
            for _ in range(args.rounds):
                for task, prompt in prompts:
                    steps: list[StepEvent] = []
                    for event in generator.generate(prompt, GenerationLimits(max_tokens=args.n_predict)):
                        if isinstance(event, StepEvent):
                            steps.append(event)
                        elif isinstance(event, DoneEvent):
                            generated = event.stats.generated
                    decoded = sum(part.drafted for s in steps for part in s.parts(as_counted=False) if part.source == "model")
                    cost = c * decoded + sum(verify.decode(s.drafted + 1) for s in steps)
                    speedups.setdefault((task, spec), []).append(generated / cost)
                    catch_up += sum(s.catch_up_seconds for s in steps)
                    step_time += sum(s.draft_seconds + s.target_seconds + s.other_seconds for s in steps)
            print(f"{spec}: catch-up {catch_up / step_time:.1%} of the step time (not priced)")
    tasks = list(dict.fromkeys(task for task, _ in prompts))
    print(f"{'task':<10}" + "".join(f"{spec:>13}" for spec in specs))
    for task in tasks:
        print(f"{task:<10}" + "".join(f"{statistics.mean(speedups[(task, spec)]):>12.2f}x" for spec in specs))
    means = [statistics.geometric_mean([statistics.mean(speedups[(task, spec)]) for task in tasks]) for spec in specs]
    print(f"{'geomean':<10}" + "".join(f"{mean:>12.2f}x" for mean in means))


if __name__ == "__main__":
    main()
