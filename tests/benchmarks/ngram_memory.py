"""Benchmark (not a test): peak RSS and time outside llama_decode, the target alone against
`--spec ngram` with `--k auto`, at a 16,000-token prompt. One mode per process, so each peak RSS is
its own:

    .venv/bin/python tests/benchmarks/ngram_memory.py target
    .venv/bin/python tests/benchmarks/ngram_memory.py ngram

The target is the default pair's (Gemma 3 270M F32); the prompt is this repository's documentation
(README.md, the pages of docs/ in name order, then this folder's RESULTS.md: the manual the README
held until it moved to docs/), cut at 16,000 tokens, so the context ends in text that has not repeated
(repeated, a shorter text would end in a copy the lookup predicts far better than text). Temperature 0.8, so verification computes probability rows (the costly case).
"""
from __future__ import annotations

import resource
import sys
from pathlib import Path

from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.drafting.planner import Planner
from speccli.drafting.ngram import NgramLookup
from speccli.drafting.policy import AutoK
from speccli.llama.model import LoadOptions, Model
from speccli.models.config import load_registry
from speccli.models.resolve import resolve_model

PROMPT_TOKENS = 16_000


def main(mode: str) -> None:
    target = Model(resolve_model("gemma3-270m-f32", load_registry(), quiet=True), LoadOptions(n_ctx=16_384))
    here = Path(__file__).resolve().parent
    repository = here.parents[1]
    pages = [repository / "README.md", *sorted((repository / "docs").glob("*.md")), here / "RESULTS.md"]
    text = "".join(page.read_text() for page in pages)
    prompt = target.tokenizer.tokenize(text)[:PROMPT_TOKENS]
    if len(prompt) < PROMPT_TOKENS:
        sys.exit(f"the documentation is {len(prompt)} tokens, fewer than the {PROMPT_TOKENS} this measures at")
    drafter = Planner(NgramLookup()) if mode == "ngram" else None
    generator = Generator(target, drafter, SamplingParams(temperature=0.8), AutoK(), seed=1)
    stats = list(generator.generate(prompt, GenerationLimits(max_tokens=128)))[-1].stats
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    outside = stats.draft_seconds + stats.other_seconds
    print(
        f"{mode}: {len(prompt)}-token prompt, {stats.generated} generated, {stats.tokens_per_second:.1f} tok/s, "
        f"peak RSS {peak_mib:.0f} MiB, outside llama_decode {100 * outside / stats.decode_seconds:.1f}% of decode, "
        f"K chosen {dict(sorted(stats.draft_lengths.items()))}"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("target", "ngram"):
        sys.exit("usage: ngram_memory.py target|ngram")
    main(sys.argv[1])
