"""What a grammar costs the host per row: llguidance's mask, and the mask applied to a row of logits.

For each GGUF file given (its vocabulary only is loaded), a JSON schema's replies are walked token by
token through `core/constraint.py` as the engine reads them, and each row's costs are timed:

- `llguidance's mask`: llguidance computing which tokens may come next, as bits;
- `mask`: that, as a row of bools (`Constraint.allowed`);
- `row read`: the row read through that mask (`Constraint.read`): where it allows few tokens, their ids
  and logits; where it allows most, the others set to -inf in the logits themselves (a fresh copy of them
  is given to each call, untimed);
- `forced`: asking which tokens the grammar forces (the planner does once a step);
- `filters after`: chat's filters (top-k 40, top-p 0.95, min-p 0.05, T 0.8) on the row read, against the same on
  the raw row, since masking changes what they cost.

Also the one-time costs: reading the vocabulary for llguidance, and compiling the schema.

`row read` is timed first at each state, as the engine computes it: a second mask at the same state
costs a fraction of the first (its paths through llguidance's token trie are in the cache). Between rows
the caches hold what the last row left there, as on a GPU host; on a CPU host a decode streams the
model's weights through them between rows: `--traffic MB` reads that many megabytes between rows (a
model's size: its rows then cost what they cost inside the engine there).

    .venv/bin/python tests/benchmarks/grammar_mask.py QWEN.gguf GEMMA.gguf [--traffic 1000]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from llguidance.numpy import fill_next_token_bitmask

from speccli.core.constraint import Grammar, GrammarSpec
from speccli.core.sampling import SamplingParams, distribution, distribution_among
from speccli.llama.tokenizer import load_vocab_only

SCHEMA = json.loads((Path(__file__).parents[2] / "docs/examples/extract.schema.json").read_text())
# The same with every string at most 60 characters: a counted repetition llguidance's token index cannot
# shortcut, so its masks cost several times more.
BOUNDED = {**SCHEMA, "properties": {name: {**rule, "maxLength": 60} if rule.get("type") == "string" else rule
                                    for name, rule in SCHEMA["properties"].items()}}
REPLIES = [
    {"name": "Maria Gonzalez", "age": 34, "city": "Valencia", "occupation": "nurse", "skills": ["emergency care", "Spanish"]},
    {"name": "Lars Eriksson", "age": 45, "city": "Stockholm", "occupation": "taxi driver", "skills": ["Swedish", "Finnish", "English"]},
    {"name": "Olu Adeyemi", "age": None, "city": "Lagos", "occupation": "photographer", "skills": []},
]
CHAT = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


def micro(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    return f"median {statistics.median(ordered) * 1e6:7.1f} µs · p90 {ordered[int(0.9 * len(ordered))] * 1e6:7.1f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--traffic", type=int, default=0, help="megabytes read between rows, as a CPU decode does")
    args = parser.parse_args()
    traffic = np.ones(args.traffic * 2**18, dtype=np.float32)
    rng = np.random.default_rng(0)
    for path in args.models:
        tokenizer = load_vocab_only(path)
        started = time.perf_counter()
        vocabulary = tokenizer.grammar_vocabulary()
        built = time.perf_counter() - started
        for label, schema in (("extract.schema.json", SCHEMA), ("its strings at most 60 characters", BOUNDED)):
            measure(tokenizer, vocabulary, built, label, schema, rng, traffic)
        tokenizer.close()


def measure(tokenizer, vocabulary, built: float, label: str, schema: dict, rng: np.random.Generator,
            traffic: np.ndarray) -> None:
    """Walk REPLIES under `schema`, five times, timing each row's costs; print their medians and p90s."""
    started = time.perf_counter()
    grammar = Grammar(GrammarSpec.json_schema(schema), vocabulary, tokenizer.n_vocab)
    constraint = grammar.start()
    compiled = time.perf_counter() - started
    raw = rng.normal(0, 3, size=tokenizer.n_vocab).astype(np.float32)
    logits = np.empty_like(raw)
    costs: dict[str, list[float]] = {"row read": [], "llguidance's mask": [], "mask": [], "forced": [], "filters after": [],
                                     "filters, no grammar": []}
    for _ in range(5):
        for reply in REPLIES:
            constraint = grammar.start()
            for token in tokenizer.tokenize(json.dumps(reply), add_special=False):
                np.copyto(logits, raw)
                traffic.sum()
                for name, work in (("row read", lambda: constraint.read(logits)),
                                   ("llguidance's mask", lambda: fill_next_token_bitmask(constraint._matcher, constraint._bits)),
                                   ("mask", constraint.allowed), ("forced", lambda: constraint.forced(64))):
                    began = time.perf_counter()
                    work()
                    costs[name].append(time.perf_counter() - began)
                np.copyto(logits, raw)
                ids, values = constraint.read(logits)
                for name, work in (("filters after", lambda: distribution_among(ids, values, CHAT, len(raw))), ("filters, no grammar", lambda: distribution(raw, CHAT))):
                    began = time.perf_counter()
                    work()
                    costs[name].append(time.perf_counter() - began)
                constraint.push([token])
    print(f"{tokenizer.path.name}: {tokenizer.n_vocab:,} tokens · vocabulary read for llguidance in {built:.2f} s · "
          f"{label}: compiled in {compiled * 1e3:.1f} ms · {len(costs['mask'])} rows · {traffic.nbytes >> 20} MB read between rows")
    for name, seconds in costs.items():
        print(f"  {name:20s} {micro(seconds)}")


if __name__ == "__main__":
    main()
