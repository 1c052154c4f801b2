"""Benchmark (not a test): how far a verify decode's rows are from one-row decodes of the same positions.

Speculative sampling is exact for the distribution it verifies against: the target's rows from a
batched verify decode (K+1 rows). The target alone samples from one-row decodes, and llama.cpp does
not compute the two bit-identically. This measures the gap in the distribution actually sampled from
(speccli's `probabilities`: temperature 0.8 with SamplingParams' own top-p 1 / min-p 0, and with chat's
defaults top-p 0.95 / min-p 0.05), position by position:

* one-row: the text's first PREFIX tokens decoded as a prompt, then one token per decode, one logits
  row each (as the target alone generates);
* W-row verify, for W in 2, 4, 5 and 25: the same prompt, then the text in decodes of W tokens with W
  logits rows each (as a run of verifies of K = W - 1 drafts that keep all of them builds the cache).

For each position: total variation 0.5 * sum |p1 - pW| and KL(p1 || pW) in nats (infinite where a
token the one-row distribution keeps is filtered out of the verify row's); the table gives the median
and the worst over the positions, the positions whose kept sets differ (the filtered setting), the
positions whose verify row is bit-identical to the one-row row, and the largest logit difference.

    .venv/bin/python tests/benchmarks/verify_numerics.py [--positions 150] [--threads N]
        [--widths 2,4,5,25] [--models gemma3-270m-f32,gemma3-270m-q4km,qwen2.5-coder-1.5b-instruct-q4km]

The text is this repository's README.md (tokenized by each model), from its start.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import speccli  # noqa: F401  first: llama.cpp's library mapped before numpy (docs/gpu.md)
import numpy as np

from speccli.core.sampling import SamplingParams, probabilities
from speccli.llama.model import LoadOptions, Model
from speccli.models.config import load_registry
from speccli.models.resolve import resolve_model

MODELS = {
    "Gemma 3 270M F32 (bundled target)": "gemma3-270m-f32",
    "Gemma 3 270M Q4_K_M (bundled draft)": "gemma3-270m-q4km",
    "Qwen2.5-Coder 1.5B Q4_K_M": "qwen2.5-coder-1.5b-instruct-q4km",
}
WIDTHS = (2, 4, 5, 25)  # 2, 5 and 25 asked; 4 is where quantized rows start to differ
PREFIX = 16
SETTINGS = {
    "T 0.8": SamplingParams(temperature=0.8),
    "T 0.8, top-p 0.95, min-p 0.05": SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05),
}


def one_row_logits(model: Model, tokens: list[int], positions: int) -> np.ndarray:
    """Logits rows of positions PREFIX-1 .. PREFIX-1+positions-1, one decode each."""
    model.reset()
    model.decode(tokens[: PREFIX - 1], n_logit_rows=0)
    rows = np.empty((positions, model.n_vocab), dtype=np.float32)
    for i in range(positions):
        rows[i] = model.decode([tokens[PREFIX - 1 + i]], n_logit_rows=1)[0]
    model.reset()
    return rows


def verify_logits(model: Model, tokens: list[int], positions: int, width: int) -> np.ndarray:
    """The same positions' rows from decodes of `width` tokens with `width` rows each."""
    model.reset()
    model.decode(tokens[: PREFIX - 1], n_logit_rows=0)
    rows = np.empty((positions, model.n_vocab), dtype=np.float32)
    for start in range(0, positions, width):
        chunk = tokens[PREFIX - 1 + start : PREFIX - 1 + start + width]  # the last one may run past: kept whole
        logits = model.decode(chunk, n_logit_rows=len(chunk))
        count = min(len(chunk), positions - start)
        rows[start : start + count] = logits[:count]
    model.reset()
    return rows


def distances(single: np.ndarray, batched: np.ndarray, sampling: SamplingParams) -> tuple[np.ndarray, np.ndarray, int]:
    """Per position: total variation, KL(single || batched) (inf where supports differ), and how many
    positions keep different token sets."""
    tv, kl, support_differs = [], [], 0
    for one, many in zip(single, batched):
        p = probabilities(one, sampling)[0].astype(np.float64)
        q = probabilities(many, sampling)[0].astype(np.float64)
        tv.append(0.5 * np.abs(p - q).sum())
        kept = p > 0
        if np.any((p > 0) != (q > 0)):
            support_differs += 1
        kl.append(np.inf if np.any(q[kept] == 0) else float(np.sum(p[kept] * np.log(p[kept] / q[kept]))))
    return np.array(tv), np.array(kl), support_differs


def fmt(value: float) -> str:
    return "inf" if np.isinf(value) else f"{value:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=150)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="verify rows, comma-separated")
    parser.add_argument("--models", default=",".join(MODELS.values()), help="registry names, comma-separated")
    arguments = parser.parse_args()
    widths = [int(width) for width in arguments.widths.split(",")]
    labels = {name: label for label, name in MODELS.items()}
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    registry = load_registry()
    print(f"{arguments.positions} positions of README.md after a {PREFIX}-token prompt; KL(one-row || verify) in nats\n")
    print("| model | sampling | verify rows | TV median | TV worst | KL median | KL worst | kept sets differ | rows identical | max logit diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in arguments.models.split(","):
        label = labels.get(name, name)
        began = time.perf_counter()
        with Model(resolve_model(name, registry, quiet=True), LoadOptions(n_ctx=1024, n_threads=arguments.threads)) as model:
            tokens = model.tokenizer.tokenize(text)
            positions = min(arguments.positions, len(tokens) - PREFIX)
            single = one_row_logits(model, tokens, positions)
            for width in widths:
                batched = verify_logits(model, tokens, positions, width)
                logit_gap = float(np.abs(single - batched).max())
                identical = int(np.sum(np.all(single == batched, axis=1)))
                for setting, sampling in SETTINGS.items():
                    tv, kl, differ = distances(single, batched, sampling)
                    print(
                        f"| {label} | {setting} | {width} | {fmt(np.median(tv))} | {fmt(tv.max())} | "
                        f"{fmt(np.median(kl))} | {fmt(kl.max())} | {differ} of {positions} | {identical} | {logit_gap:.3g} |",
                        flush=True,
                    )
        print(f"<!-- {label}: {time.perf_counter() - began:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
