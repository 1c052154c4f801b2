"""Benchmark (not a test): a draft of another vocabulary in its two modes, side by side on one pair.

    .venv/bin/python tests/benchmarks/translation_modes.py gemma3-270m-f32 qwen2.5-coder-0.5b-instruct-q4km

For each built-in bench prompt, at temperature 0 and 0.8, K=4 every step: the draft's text re-tokenized
(proposals with certainty) and token-level intersection (the shared tokens, with q), alternately, one
generator each over the same loaded models. Prints, per mode and temperature, the share of drafted
tokens kept and tokens per target decode: what decides which mode a pair should use (TLI_MIN_SHARE in
speccli/drafting/specs.py). Seconds are printed too, but on a CPU neither mode pays (docs/results.md).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.drafting.policy import FixedK
from speccli.drafting.planner import Planner
from speccli.drafting.translated import TranslatedDrafter
from speccli.llama.model import LoadOptions, Model
from speccli.models.config import load_registry
from speccli.models.resolve import resolve_models
from speccli.vocab.info import read_vocab
from speccli.vocab.shared import shared_vocabulary

PROMPTS = Path(__file__).resolve().parents[2] / "speccli" / "data" / "bench_prompts.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("-n", type=int, default=48, help="tokens per reply")
    parser.add_argument("-k", type=int, default=4)
    args = parser.parse_args()
    target_path, draft_path = resolve_models([args.target, args.draft], load_registry(), quiet=True)
    shared = shared_vocabulary(read_vocab(draft_path), read_vocab(target_path))
    print(f"shared: {shared.share:.0%} of the draft's text tokens ({len(shared.draft_ids)})")
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    options = LoadOptions(n_ctx=2048)
    with Model(target_path, options) as target, Model(draft_path, options) as draft:
        for temperature in (0.0, 0.8):
            totals = {mode: [0, 0, 0, 0, 0.0] for mode in ("text", "shared tokens")}  # drafted, kept, steps, tokens, seconds
            for index, prompt in enumerate(prompts):
                tokens = target.tokenizer.tokenize(prompt)
                for mode in (("text", "shared tokens") if index % 2 == 0 else ("shared tokens", "text")):
                    drafter = TranslatedDrafter(draft, target.tokenizer, None if mode == "text" else shared)
                    generator = Generator(target, Planner(model=drafter), SamplingParams(temperature=temperature), FixedK(args.k), seed=index)
                    began = time.perf_counter()
                    stats = list(generator.generate(tokens, GenerationLimits(max_tokens=args.n)))[-1].stats
                    total = totals[mode]
                    total[0] += stats.positions.drafted
                    total[1] += stats.positions.accepted
                    total[2] += stats.steps
                    total[3] += stats.generated
                    total[4] += time.perf_counter() - began
                    draft.reset()
            for mode, (drafted, kept, steps, generated, seconds) in totals.items():
                print(f"T={temperature:g} {mode:<13} kept {kept / max(drafted, 1):.2f} of {drafted} drafted, "
                      f"{generated / max(steps, 1):.2f} tokens per target decode, {generated / seconds:.1f} tok/s")


if __name__ == "__main__":
    main()
