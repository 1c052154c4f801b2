"""Benchmark (not a test): is what llama.cpp's speculative tools write at T > 0 the target's law?

    .venv/bin/python tests/benchmarks/llama_speculative_bias.py --samples 150

`examples/speculative/speculative.cpp` drafts the draft's most likely token (`cur_p->data[0]` after
sorting), not a sample of q, and keeps it where r <= p_tgt / p_dft. For a token not drawn from q that
rule is not the target's law: with the draft the target itself, it keeps every draft, so every token
after the first is the draft's most likely one. `llama-speculative-simple` keeps a draft only where the
target's own sample equals it (exact, and slower at T > 0).

One GGUF file (default: Gemma 3 270M Q4_K_M, the bundled pair's draft) is target and draft alike; the
prompt "My favourite colour is" at chat's defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05). Each row
samples the first two generated tokens `--samples` times (seeds 1, 2, ...) and tests them with one
Pearson chi-square against the exact joint law computed from the target's own logits (every prefix
walked, tests/token_distribution.py): speccli (`Generator` with the model as draft, K = --n-max),
llama-completion (the target alone: the control for this harness), llama-speculative-simple and
llama-speculative (`--spec-draft-n-max`). A tool's tokens are read back from its text: the pair of
the law's support whose pieces the text starts with (the longest first piece on a tie). Also printed:
how often the second token is the target's most likely one given the first, sampled against exact, and
the chance under the law of that many or more (the bias this tool is suspected of favours exactly that).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from speccli.core.generator import GenerationLimits, Generator  # noqa: E402
from speccli.core.sampling import SamplingParams  # noqa: E402
from speccli.core.stats import TokenEvent  # noqa: E402
from speccli.drafting.model import ModelDrafter  # noqa: E402
from speccli.drafting.planner import Planner  # noqa: E402
from speccli.drafting.policy import FixedK  # noqa: E402
from speccli.llama.model import LoadOptions, Model  # noqa: E402
from speccli.models.config import load_registry  # noqa: E402
from speccli.models.resolve import resolve_model  # noqa: E402
from tests.token_distribution import chi_square_p_value, exact_distribution  # noqa: E402

CHAT = SamplingParams(0.8, top_k=40, top_p=0.95, min_p=0.05)
PROMPT = "My favourite colour is"


def speccli_pairs(path: Path, prompt: list[int], samples: int, n_max: int) -> list[tuple[int, ...]]:
    options = LoadOptions(n_ctx=256, n_threads=2)
    with Model(path, options) as target, Model(path, options) as draft:
        generator = Generator(target, Planner(model=ModelDrafter(draft)), CHAT, FixedK(n_max))
        pairs = []
        for seed in range(1, samples + 1):
            generator.rng = np.random.default_rng(seed)
            generator.reset()
            tokens = [e.token for e in generator.generate(prompt, GenerationLimits(max_tokens=2)) if isinstance(e, TokenEvent)]
            pairs.append(tuple(tokens[:2]))
        return pairs


def tool_text(tools: Path, tool: str, path: Path, seed: int, n_max: int) -> str:
    command = [str(tools / tool), "-m", str(path), "-p", PROMPT, "-n", "4", "-t", "2", "-c", "256", "--seed", str(seed),
               "-ngl", "0", "--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"]
    if tool == "llama-completion":
        command += ["-no-cnv"]
    else:
        command += ["-md", str(path), "-devd", "none", "-ngld", "0", "--spec-type", "draft-simple",
                    "--spec-draft-n-max", str(n_max)]
    result = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{tool} failed ({result.returncode}): {result.stderr[-1500:]}")
    return result.stdout.split(PROMPT, 1)[1]


def read_back(text: str, pieces: dict[tuple[int, ...], tuple[str, str]]) -> tuple[int, ...]:
    """The pair of the law's support the text starts with; () where none does."""
    matches = [pair for pair, (first, second) in pieces.items() if text.startswith(first + second)]
    return max(matches, key=lambda pair: (len(pieces[pair][0]), len(pieces[pair][1])), default=())


def upper_tail(successes: int, chances: list[float]) -> float:
    """P(at least `successes` of independent trials succeed), trial i with probability chances[i]."""
    ways = np.zeros(len(chances) + 1)
    ways[0] = 1.0
    for chance in chances:
        ways[1:] = ways[1:] * (1 - chance) + ways[:-1] * chance
        ways[0] *= 1 - chance
    return float(ways[successes:].sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", type=Path, help="the GGUF file, target and draft alike (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--samples", type=int, default=150)
    parser.add_argument("--n-max", type=int, default=4)
    parser.add_argument("--tools", type=Path, default=Path("/work/llama.cpp-tools/bin"))
    parser.add_argument("--only", default="speccli,llama-completion,llama-speculative-simple,llama-speculative")
    args = parser.parse_args()
    path = args.file or resolve_model("gemma3-270m-q4km", load_registry(), quiet=True)
    with Model(path, LoadOptions(n_ctx=256, n_threads=2)) as target:
        prompt = target.tokenizer.tokenize(PROMPT)
        law = exact_distribution(target, prompt, CHAT, 2)
        piece = lambda token: target.tokenizer.token_bytes(token, special=True).decode("utf-8", "replace")  # noqa: E731  (as the tools print)
        pieces = {pair: (piece(pair[0]), piece(pair[1])) for pair in law if len(pair) == 2}
    first = Counter()
    for (t1, _), probability in law.items():
        first[t1] += probability
    top_second = {t1: max((p, t2) for (a, t2), p in law.items() if a == t1)[1] for t1 in first}
    print(f"{path.name} as target and draft; {PROMPT!r}, T 0.8, top-k 40, top-p 0.95, min-p 0.05; "
          f"{args.samples} samples a row, n-max {args.n_max}")
    print(f"{'row':<28} {'chi2 p':>9} {'read back':>10} {'2nd = most likely':>18} {'exact':>6} {'tail p':>8}")
    for row in args.only.split(","):
        if row == "speccli":
            pairs = speccli_pairs(path, prompt, args.samples, args.n_max)
        else:
            if not (args.tools / row).exists():
                print(f"{row:<28} (not built in {args.tools})")
                continue
            pairs = [read_back(tool_text(args.tools, row, path, seed, args.n_max), pieces) for seed in range(1, args.samples + 1)]
        read = [pair for pair in pairs if len(pair) == 2]
        p_value = chi_square_p_value(read, law)
        hits = sum(pair[1] == top_second[pair[0]] for pair in read)
        chances = [law[(t1, top_second[t1])] / first[t1] for t1, _ in read]  # the law's, given each first token
        tail = upper_tail(hits, chances)  # that many or more second tokens the most likely, under the law
        print(f"{row:<28} {p_value:>9.2g} {len(read):>4}/{len(pairs):<5} {hits / len(read):>18.2f} "
              f"{sum(chances) / len(read):>6.2f} {tail:>8.2g}", flush=True)


if __name__ == "__main__":
    main()
