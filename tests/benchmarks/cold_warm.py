"""Benchmark (not a test): a first reply from `auto`'s priors against one from a policy carried over
earlier replies of the same prompt, seed by seed, alternating in one process.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/cold_warm.py TARGET.gguf DRAFT.gguf PROMPT.txt [--seeds 12]

For each seed: `warm` (one `AutoK` carried from reply to reply, as a process that learnt the text) and
`cold` (a fresh `AutoK`: the priors), both `--spec suffix+model` at chat's defaults, 128 tokens, with the
one cost profile shared (timed before the first reply), so only what `auto` learnt of the text differs.
Prints each reply's tok/s and steps by source, then the median and geometric mean of cold over warm.
Sampled replies differ from seed to seed far more than between the two (loop_overhead.py's 3 rounds
are too few to tell them apart).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from speccli.core.generator import GenerationLimits, Generator, PairCosts  # noqa: E402
from speccli.core.sampling import SamplingParams  # noqa: E402
from speccli.core.stats import DoneEvent, StepEvent  # noqa: E402
from speccli.drafting.policy import AutoK  # noqa: E402
from speccli.drafting.specs import make_drafter  # noqa: E402
from speccli.llama.model import LoadOptions, Model  # noqa: E402

CHAT = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("prompt", type=Path, help="a text file: the prompt")
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--n-predict", type=int, default=128)
    args = parser.parse_args()
    options = LoadOptions(n_ctx=2048, n_threads=2)
    target, draft = Model(args.target, options), Model(args.draft, options)
    prompt = target.tokenizer.tokenize(args.prompt.read_bytes())
    costs, warm, rates = None, AutoK(), collections.defaultdict(list)
    for seed in range(42, 42 + args.seeds):
        for label in ("warm", "cold"):
            drafter = make_drafter("suffix+model", draft, target)
            costs = costs or PairCosts(target, drafter)
            generator = Generator(target, drafter, CHAT, warm if label == "warm" else AutoK(), seed=seed, costs=costs)
            by_source: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
            started = time.perf_counter()
            for event in generator.generate(prompt, GenerationLimits(max_tokens=args.n_predict)):
                if isinstance(event, StepEvent):
                    counts = by_source[event.source or "plain"]
                    counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + event.drafted, counts[2] + event.accepted
                elif isinstance(event, DoneEvent):
                    done = event
            generator.reset()
            rate = done.stats.generated / (time.perf_counter() - started - done.stats.prefill_seconds)
            rates[label].append(rate)
            steps = ", ".join(f"{name} {n} steps {d} drafted {k} kept" for name, (n, d, k) in sorted(by_source.items()))
            print(f"seed {seed} {label}: {rate:5.1f} tok/s ({done.stats.generated} tokens): {steps}", flush=True)
    ratios = [cold / warm for cold, warm in zip(rates["cold"], rates["warm"])]
    print(f"cold over warm, {len(ratios)} seeds: median {statistics.median(ratios):.2f}x, geometric mean "
          f"{statistics.geometric_mean(ratios):.2f}x (tok/s medians: warm {statistics.median(rates['warm']):.1f}, "
          f"cold {statistics.median(rates['cold']):.1f})")


if __name__ == "__main__":
    main()
