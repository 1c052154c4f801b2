"""The device check's measurements and its report (check.sh runs each step; this module owns what a step does).

    python .ci/device/check.py models   --scale device|rehearse --dir WORK/models
    python .ci/device/check.py load     --models WORK/models --ngl 99 --out WORK/load.json
    python .ci/device/check.py greedy   --models WORK/models --ngl 99 --out WORK/greedy.json
    python .ci/device/check.py chi2     --models WORK/models --ngl 99 --samples 3000 --out WORK/chi2.json
    python .ci/device/check.py speed    --models WORK/models --out WORK/speed.json [--gpu-tokens 128 --cpu-tokens 16]
    python .ci/device/check.py summary  --work WORK --out OUT

* models: a related target/draft pair (tests/tiny_gguf.py's `write_related_pair`: the draft is the target's
  first layer, bit for bit). At the device scale the target holds 4.4 GB of F16 weights in 8 wide layers,
  so one decode streams all of it and is memory-bound on a GPU; the rehearsal scale is small and quick.
* load: whether a model loads and decodes on the GPU, each way of starting in its own process (why:
  docs/gpu.md, "GPU figures"): the report names which ways crash, so one run tells the cause. check.sh
  then runs the rest the way that worked.
* greedy: at temperature 0, speculative output equals the target's own greedy output, or parts only at a
  near-tie of the target's top two logits (speccli.core.parting, as the CPU tests and bench explain it).
* chi2: the first two sampled tokens at temperature 0.8 follow the target's exact joint distribution
  (computed from its logits), target alone and speculative; a broken rule run the same way must fail.
* speed: target-only decode tokens/s with every layer on the GPU and with none (-ngl 0).
* summary: results.json and summary.txt from every step's record and part, rewritten after each step
  so that a run cut short still leaves its report.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: tests.tiny_gguf

SAMPLING_TEMPERATURE = 0.8
GREEDY_MAX_TOKENS = 64
GREEDY_CONFIGS = [("model", 4), ("model", 8), ("ngram+model", "auto")]  # (spec, K)
CHI2_PROMPT = "the cat sat on"
CHI2_TOP_K = 12  # fewer cells: 3000 samples then see a broken rule (the CPU test's setting)
CHI2_PASS_P = 1e-3  # a correct rule fails this one time in a thousand
CHI2_BROKEN_P = 1e-6  # a broken rule must fall below this


# --- models --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """The pair's shape. F16 bytes of one layer: 2 * (2*E*E + 2*E*E_kv + 3*E*F)."""

    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    target_layers: int
    draft_layers: int
    eps: float  # the target's extra layers' residual scale: greedy agreement falls as it grows

    def layer_bytes(self) -> int:
        kv_rows = self.n_head_kv * (self.n_embd // self.n_head)
        return 2 * (2 * self.n_embd * self.n_embd + 2 * self.n_embd * kv_rows + 3 * self.n_embd * self.n_ff)


SCALES = {
    # 8 layers of 550 MB (a 13B model's width): one decode reads 4.4 GB, ~0.9 ms at the H200's 4.8 TB/s,
    # so the step is bound by memory, not by kernel launches (the 1.76 GB pair of the first leases ran at
    # 0.9 ms, 40% of the bandwidth); a 16-token verify reads the same weights once and costs little more;
    # the 1-layer draft reads 1/8 of it.
    "device": Scale(n_embd=5120, n_ff=13824, n_head=40, n_head_kv=8, target_layers=8, draft_layers=1, eps=0.05),
    "rehearse": Scale(n_embd=256, n_ff=768, n_head=4, n_head_kv=2, target_layers=4, draft_layers=1, eps=0.05),
}
# The chi-square check's own pair, at both scales: a draft that disagrees more often (as in
# tests/test_engine_distribution.py: 4 layers against 2, eps 0.3), so rejections, and with them the
# residual rule, shape many samples; exactness does not need a large model, speed does.
CHI2_SCALE = Scale(n_embd=256, n_ff=768, n_head=4, n_head_kv=2, target_layers=4, draft_layers=2, eps=0.3)


def write_models(scale: Scale, directory: Path) -> dict:
    """The pair of this scale (greedy, bench, speed) and the chi-square pair, with their sizes."""
    target, draft = write_pair(scale, directory, "device")
    chi2_target, chi2_draft = write_pair(CHI2_SCALE, directory, "chi2")
    return {
        "target": str(target), "draft": str(draft), "scale": asdict(scale),
        "target_bytes": target.stat().st_size, "draft_bytes": draft.stat().st_size,
        "target_layer_weight_bytes": scale.layer_bytes() * scale.target_layers,
        "chi2_target": str(chi2_target), "chi2_draft": str(chi2_draft), "chi2_scale": asdict(CHI2_SCALE),
    }


def write_pair(scale: Scale, directory: Path, name: str) -> tuple[Path, Path]:
    import numpy as np

    from tests.tiny_gguf import TinyConfig, write_related_pair

    config = TinyConfig(
        vocab_size=512, n_embd=scale.n_embd, n_ff=scale.n_ff, n_head=scale.n_head, n_head_kv=scale.n_head_kv,
        context_length=4096, weight_dtype=np.float16,
    )
    return write_related_pair(
        directory, target_layers=scale.target_layers, draft_layers=scale.draft_layers, eps=scale.eps, config=config,
        name=name,
    )


def load_pair(models: Path, n_gpu_layers: int, prefix: str = "", n_ctx: int = 1024):
    """The target and draft models.json names (prefix "chi2_": the chi-square pair), loaded."""
    from speccli.llama.model import LoadOptions, Model

    paths = json.loads((models / "models.json").read_text())
    options = LoadOptions(n_ctx=n_ctx, n_gpu_layers=n_gpu_layers)
    return Model(Path(paths[prefix + "target"]), options), Model(Path(paths[prefix + "draft"]), options)


# --- loading on the GPU ---------------------------------------------------------------------------------

# Each way is a Python program run in its own process with faulthandler on: {model} and {ngl} are filled in.
_LOAD_AND_DECODE = """
from pathlib import Path
from speccli.llama.model import LoadOptions, Model
with Model(Path({model!r}), LoadOptions(n_ctx=256, n_gpu_layers={ngl})) as model:
    tokens = model.tokenizer.tokenize("the cat sat on")
    print("decoded", model.decode(tokens).shape)
"""
LOAD_WAYS = [
    # (name, program, environment): the first is speccli as shipped, which loads llama.cpp's library
    # before numpy (speccli/llama/load_order.py); the third, numpy first, is how the first run crashed.
    ("speccli Model, as shipped", _LOAD_AND_DECODE, {}),
    ("speccli Model, llama_cpp imported first", "import llama_cpp\n" + _LOAD_AND_DECODE, {}),
    ("speccli Model, numpy imported before speccli", "import numpy\n" + _LOAD_AND_DECODE, {}),
    ("speccli Model, OPENBLAS_NUM_THREADS=1", _LOAD_AND_DECODE, {"OPENBLAS_NUM_THREADS": "1"}),
    ("speccli Model, OMP_NUM_THREADS=1", _LOAD_AND_DECODE, {"OMP_NUM_THREADS": "1"}),
    ("llama-cpp-python's Llama, numpy imported first",
     "import numpy, llama_cpp\nllama_cpp.Llama({model!r}, n_gpu_layers={ngl}, n_ctx=256, verbose=False)('the cat', max_tokens=2)\n"
     "print('decoded')\n", {}),
]


def load_check(models: Path, n_gpu_layers: int, timeout: float = 60) -> dict:
    """Each of LOAD_WAYS on the chi-square pair's small target (the first run's crash came with any
    model, and six loads of the 4.4 GB one would cost the run seconds): its exit status and its
    output's last lines (a crash's faulthandler traceback among them)."""
    import subprocess

    model = json.loads((models / "models.json").read_text())["chi2_target"]
    ways = []
    for name, program, env in LOAD_WAYS:
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", program.format(model=model, ngl=n_gpu_layers)],
                                  capture_output=True, text=True, timeout=timeout, env={**os.environ, **env},
                                  cwd=Path(__file__).resolve().parents[2])
            rc, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            rc, output = 124, f"timed out after {timeout:.0f} s: {expired.stdout or ''}{expired.stderr or ''}"
        ways.append({"name": name, "env": env, "rc": rc, "loaded": rc == 0 and "decoded" in output,
                     "warned": "numpy was imported before speccli" in output,  # speccli/llama/load_order.py
                     "seconds": round(time.perf_counter() - started, 2), "tail": output.strip().splitlines()[-12:]})
    return {"model": model, "n_gpu_layers": n_gpu_layers, "ways": ways, "passed": ways[0]["loaded"],
            # check.sh runs the later steps with llama_cpp imported first when only that way loads.
            "preload_llama_cpp": not ways[0]["loaded"] and ways[1]["loaded"]}


def load_lines(load: dict | None) -> list[str]:
    if not load:
        return ["", "loading on the GPU: not run or failed (see log.txt)"]
    lines = ["", f"loading on the GPU (-ngl {load['n_gpu_layers']}): {'PASSED' if load['passed'] else 'FAILED'}"
                 + ("; the later steps ran with llama_cpp imported first" if load["preload_llama_cpp"] else "")]
    for way in load["ways"]:
        outcome = ("loads" if way["loaded"] else f"FAILS (exit {way['rc']})") + (", warned first" if way.get("warned") else "")
        lines.append(f"  {way['name']:<48} {outcome}")
        if not way["loaded"]:
            lines += [f"      {line}" for line in way["tail"][-6:]]
    return lines


# --- greedy identity ------------------------------------------------------------------------------------


def greedy_check(models: Path, n_gpu_layers: int) -> dict:
    from speccli.bench.prompts import load_prompt_set
    from speccli.core.generator import Generator
    from speccli.core.parting import find_parting
    from speccli.core.sampling import SamplingParams
    from speccli.core.stats import RunStats
    from speccli.drafting.specs import make_drafter, make_policy

    greedy = SamplingParams(temperature=0)
    prompts = [p.prompt for p in load_prompt_set(None).prompts]
    target, draft = load_pair(models, n_gpu_layers)
    with target, draft:
        tokenized = [target.tokenizer.tokenize(text) for text in prompts]
        references = [generated(Generator(target, None, greedy), prompt, GREEDY_MAX_TOKENS)[0] for prompt in tokenized]
        configs = []
        for spec, k in GREEDY_CONFIGS:
            generator = Generator(target, make_drafter(spec, draft, target), greedy, make_policy(k))
            outcomes, total = [], RunStats()
            for index, (prompt, reference) in enumerate(zip(tokenized, references)):
                speculative, stats = generated(generator, prompt, GREEDY_MAX_TOKENS)
                total = total + stats
                # The tolerance is measured at the widest verify batch this generation used, as in bench.
                widest = max(stats.draft_lengths, default=0)
                parting = find_parting(target, prompt, reference, speculative, max(widest, 1))
                if parting is None:
                    # Equal as far as both go: they may only differ in length if one side hit the end.
                    same = reference == speculative or len(reference) == len(speculative) == GREEDY_MAX_TOKENS
                    outcomes.append({"prompt": index, "status": "identical" if same else "failed",
                                     "detail": "" if same else "equal as far as both go, but one side stopped early"})
                else:
                    outcomes.append({"prompt": index, "status": "near_tie" if parting.near_tie else "failed",
                                     "detail": parting.describe()})
            configs.append({
                "spec": spec, "k": k, "outcomes": outcomes,
                "drafted": total.drafted_counted, "accepted": total.accepted,
                "acceptance_rate": total.accepted / total.drafted_counted if total.drafted_counted else None,
            })
    statuses = [o["status"] for config in configs for o in config["outcomes"]]
    return {
        "prompts": len(prompts), "max_tokens": GREEDY_MAX_TOKENS, "n_gpu_layers": n_gpu_layers, "configs": configs,
        # Drafts must really have been used, or identity proves nothing.
        "passed": "failed" not in statuses and all(config["accepted"] > 0 for config in configs),
        "identical": statuses.count("identical"), "near_ties": statuses.count("near_tie"),
        "failed": statuses.count("failed"),
    }


def generated(generator, prompt: Sequence[int], max_tokens: int):
    """The tokens of one generation from empty caches, and its statistics."""
    from speccli.core.generator import GenerationLimits
    from speccli.core.stats import TokenEvent

    generator.reset()
    events = list(generator.generate(prompt, GenerationLimits(max_tokens=max_tokens)))
    return [e.token for e in events if isinstance(e, TokenEvent)], events[-1].stats


# --- chi-square distribution check ----------------------------------------------------------------------


def chi2_check(models: Path, n_gpu_layers: int, samples: int) -> dict:
    """As tests/test_engine_distribution.py, with every layer on the GPU, at temperature 0.8 (top-k 12):
    the exact joint distribution of the first two tokens against `samples` generations of each
    configuration, on the chi-square pair."""
    from speccli.core import verify as verify_module
    from speccli.core.generator import Generator
    from speccli.core.sampling import SamplingParams
    from speccli.drafting.model import ModelDrafter
    from speccli.drafting.planner import Planner
    from speccli.drafting.policy import FixedK
    from tests.two_token_distribution import exact_two_token_distribution, sampled_pairs

    sampling = SamplingParams(temperature=SAMPLING_TEMPERATURE, top_k=CHI2_TOP_K)
    target, draft = load_pair(models, n_gpu_layers, prefix="chi2_")
    runs = []
    with target, draft:
        prompt = target.tokenizer.tokenize(CHI2_PROMPT)
        started = time.perf_counter()
        expected = exact_two_token_distribution(target, prompt, sampling)
        exact_seconds = time.perf_counter() - started

        def run(name: str, drafter, k: int, seed: int, must_pass: bool) -> None:
            started = time.perf_counter()
            generator = Generator(target, drafter, sampling, FixedK(k) if drafter else None, seed=seed)
            p_value, cells = chi_square_p_value(sampled_pairs(generator, prompt, samples, max_tokens=k + 1), expected)
            passed = p_value > CHI2_PASS_P if must_pass else p_value < CHI2_BROKEN_P
            runs.append({"name": name, "k": k, "samples": samples, "cells": cells, "p_value": p_value,
                         "expect": "pass" if must_pass else "fail", "as_expected": passed,
                         "seconds": round(time.perf_counter() - started, 2)})

        run("target alone", None, 1, seed=7, must_pass=True)
        run("model draft", Planner(model=ModelDrafter(draft)), 1, seed=1235, must_pass=True)
        run("model draft", Planner(model=ModelDrafter(draft)), 3, seed=1237, must_pass=True)
        # The control: after a rejection, draw from p itself instead of the residual max(0, p - q).
        correct_residual = verify_module.residual_distribution
        verify_module.residual_distribution = lambda p, q: p
        try:
            run("BROKEN rule (no residual), must fail", Planner(model=ModelDrafter(draft)), 3, seed=99, must_pass=False)
        finally:
            verify_module.residual_distribution = correct_residual
    return {"temperature": SAMPLING_TEMPERATURE, "top_k": CHI2_TOP_K, "prompt": CHI2_PROMPT, "n_gpu_layers": n_gpu_layers,
            "exact_distribution_seconds": round(exact_seconds, 2), "runs": runs,
            # The control says whether this many samples can see a broken rule at this agreement; it is
            # reported, but only the correct rules decide the check.
            "passed": all(r["as_expected"] for r in runs if r["expect"] == "pass"),
            "control_detected": all(r["as_expected"] for r in runs if r["expect"] == "fail")}


def chi_square_p_value(observed: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> tuple[float, int]:
    """Pearson's test on the CPU tests' cells (tests/token_distribution.py). Returns the p-value and the
    number of cells. A pair the target gives probability 0 is p = 0."""
    from tests.token_distribution import cells

    if not set(observed) <= set(expected):
        return 0.0, 0
    kept = [(o, e) for o, e in zip(*cells(observed, expected, len(observed))) if e > 1e-9]
    statistic = sum((o - e) ** 2 / e for o, e in kept)
    return chi2_survival(statistic, len(kept) - 1), len(kept)


def chi2_survival(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with df degrees of freedom (closed form, so no scipy on the device):
    even df: e^(-x/2) * sum_{i<df/2} (x/2)^i / i!; odd df: erfc(sqrt(x/2)) + e^(-x/2) * sum_{i=1}^{(df-1)/2}
    (x/2)^(i-1/2) / Gamma(i+1/2). Terms are summed in log space, so large df and x neither overflow."""
    if df < 1:
        raise ValueError("df must be at least 1")
    if x <= 0:
        return 1.0
    half = x / 2
    if df % 2 == 0:
        terms = [-half + i * math.log(half) - math.lgamma(i + 1) for i in range(df // 2)]
        head = 0.0
    else:
        terms = [-half + (i - 0.5) * math.log(half) - math.lgamma(i + 0.5) for i in range(1, (df - 1) // 2 + 1)]
        head = math.erfc(math.sqrt(half))
    return min(1.0, head + math.fsum(math.exp(t) for t in terms))


# --- target-only speed, GPU against CPU -------------------------------------------------------------------


def speed_check(models: Path, gpu_tokens: int, cpu_tokens: int, prompts: int = 2) -> dict:
    """Decode tokens/s of the target alone with every layer on the GPU and with none (-ngl 0): the median
    over `prompts` generations, prefill excluded, after one unmeasured warm-up generation."""
    # speccli before numpy: importing speccli loads llama.cpp's library first (speccli/llama/load_order.py).
    from speccli.bench.prompts import load_prompt_set
    from speccli.core.generator import Generator
    from speccli.core.sampling import SamplingParams
    from speccli.llama.model import LoadOptions, Model

    import numpy as np

    files = json.loads((models / "models.json").read_text())
    target_path = Path(files["target"])
    texts = [p.prompt for p in load_prompt_set(None).prompts][: prompts + 1]
    sides = {}
    for name, n_gpu_layers, max_tokens in (("gpu", 99, gpu_tokens), ("cpu", 0, cpu_tokens)):
        with Model(target_path, LoadOptions(n_ctx=1024, n_gpu_layers=n_gpu_layers)) as target:
            generator = Generator(target, None, SamplingParams(temperature=0))
            rates = []
            for text in texts:  # the first is the warm-up
                started = time.perf_counter()
                tokens, stats = generated(generator, target.tokenizer.tokenize(text), max_tokens)
                rates.append(len(tokens) / (time.perf_counter() - started - stats.prefill_seconds))
            sides[name] = {"n_gpu_layers": n_gpu_layers, "max_tokens": max_tokens,
                           "tokens_per_second": float(np.median(rates[1:])), "runs": [round(r, 2) for r in rates[1:]]}
    # Each decoded token reads every weight once: the bandwidth the target alone achieves on the GPU.
    bandwidth = files["target_bytes"] * sides["gpu"]["tokens_per_second"] / 1e9
    return {**sides, "gpu_over_cpu": sides["gpu"]["tokens_per_second"] / sides["cpu"]["tokens_per_second"],
            "gpu_weight_gb_per_second": bandwidth,
            "decode_shapes": {reuse: decode_shapes(models, 99, reuse) for reuse in ("reused", "rebuilt")}}


def decode_shapes(models: Path, n_gpu_layers: int, graphs: str, rounds: int = 60) -> dict:
    """Milliseconds (medians) of the draft model's decodes in a draft of 4, a 4-row verify of the target
    before each: its first decode takes 1 token (a draft cut short) or 2 (all kept: the last drafted
    token and the bonus), the rest 1. llama.cpp reuses a context's graph where a decode has the last
    one's shape; a new shape rebuilds it (and on CUDA recaptures its graph), a candidate for the fixed
    part per draft the H200 showed (docs/gpu.md). `graphs` "rebuilt" sets LLAMA_GRAPH_REUSE_DISABLE."""
    import statistics

    from speccli.llama.model import LoadOptions, Model

    files = json.loads((models / "models.json").read_text())
    os.environ["LLAMA_GRAPH_REUSE_DISABLE"] = "1" if graphs == "rebuilt" else "0"  # read as a context is made
    options = LoadOptions(n_ctx=512, n_gpu_layers=n_gpu_layers)
    try:
        with Model(Path(files["target"]), options) as target, Model(Path(files["draft"]), options) as draft:
            prompt = target.tokenizer.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
            target.decode(prompt)
            draft.decode(prompt)
            result = {}
            for first in (1, 2):
                times: list[list[float]] = [[] for _ in range(4)]
                for round_ in range(rounds + 5):  # the first 5 unmeasured
                    target.truncate(len(prompt))
                    draft.truncate(len(prompt))
                    target.decode(prompt[:4], n_logit_rows=4)
                    for position, n_tokens in enumerate((first, 1, 1, 1)):
                        started = time.perf_counter()
                        draft.decode(prompt[:n_tokens], n_logit_rows=1)
                        if round_ >= 5:
                            times[position].append(time.perf_counter() - started)
                result[f"{first} token{'s' if first > 1 else ''}"] = [round(statistics.median(t) * 1e3, 4) for t in times]
            return result
    finally:
        os.environ.pop("LLAMA_GRAPH_REUSE_DISABLE", None)


# --- the report ---------------------------------------------------------------------------------------------

BENCH_PARTS = {"bench-model": "speculative with the draft model, K swept"}
# The race's tables (check.sh's race steps write them into $OUT as they print them), in the summary as printed.
RACE_PARTS = {"race.txt": "the race against llama.cpp's tools", "race-serve.txt": "the race against llama-server"}


def summarize(work: Path, out: Path) -> list[str]:
    """results.json (every step's record and every part) and summary.txt, both written atomically."""
    steps = [json.loads(line) for line in (work / "steps.jsonl").read_text().splitlines()] if (
        work / "steps.jsonl").exists() else []
    parts = {}
    for name in ("models", "load", "greedy", "chi2", "speed"):
        parts[name] = read_json(work / "models" / "models.json" if name == "models" else work / f"{name}.json")
    for name in BENCH_PARTS:
        parts[name] = read_json(out / f"{name}.json")
    env_text = (work / "env.txt").read_text() if (work / "env.txt").exists() else ""
    meta = read_json(work / "meta.json") or {}
    lines = summary_lines(meta, steps, env_text, parts)
    for name, title in RACE_PARTS.items():
        text = (out / name).read_text().strip() if (out / name).exists() else ""
        lines += ["", f"{title} ({name}):", *(text.splitlines() or ["  not run or failed (see log.txt)"])]
    results = {"meta": meta, "steps": steps, "env": env_text, **{k: v for k, v in parts.items() if not k.startswith("bench")},
               "bench": {name: bench_digest(parts[name]) for name in BENCH_PARTS}}
    write_atomically(out / "results.json", json.dumps(results, indent=2) + "\n")
    write_atomically(out / "summary.txt", "\n".join(lines) + "\n")
    return lines


def summary_lines(meta: dict, steps: list[dict], env_text: str, parts: dict) -> list[str]:
    lines = [f"speccli device check ({meta.get('mode', '?')}) on {meta.get('host', '?')}, started {meta.get('started', '?')}"]
    total = sum(step["seconds"] for step in steps)
    lines.append(f"steps ({total:.0f} s in all):")
    for step in steps:
        status = "ok" if step["rc"] == 0 else f"FAILED (exit {step['rc']}{', timed out' if step['rc'] == 124 else ''})"
        lines.append(f"  {step['started']}  {step['name']:<12} {step['seconds']:>7.1f} s  {status}")
    lines.append("")
    lines.append("env:")
    wanted = [line for line in env_text.splitlines() if line.split(" ", 1)[0] in ("llama-cpp-python", "backend", "gpu")]
    lines += [f"  {line}" for line in wanted] or ["  (no speccli env output: see log.txt)"]
    models = parts["models"]
    lines.append("")
    if models:
        scale = models["scale"]
        lines.append(f"models: target {models['target_bytes'] / 1e9:.2f} GB F16 ({scale['target_layers']} layers, width "
                     f"{scale['n_embd']}, ffn {scale['n_ff']}), draft {models['draft_bytes'] / 1e9:.2f} GB (its first "
                     f"{scale['draft_layers']} layer(s)), eps {scale['eps']}")
        chi2 = models["chi2_scale"]
        lines.append(f"  chi-square pair: {chi2['target_layers']} layers against {chi2['draft_layers']}, width "
                     f"{chi2['n_embd']}, eps {chi2['eps']}")
    else:
        lines.append("models: not written (see log.txt)")
    lines += load_lines(parts["load"]) + greedy_lines(parts["greedy"]) + chi2_lines(parts["chi2"])
    for name, title in BENCH_PARTS.items():
        lines += bench_lines(name, title, bench_digest(parts[name]))
    lines += speed_lines(parts["speed"])
    return lines


def greedy_lines(greedy: dict | None) -> list[str]:
    if not greedy:
        return ["", "greedy identity: not run or failed (see log.txt)"]
    verdict = "PASSED" if greedy["passed"] else "FAILED"
    lines = ["", f"greedy identity (-ngl {greedy['n_gpu_layers']}, {greedy['prompts']} prompts x {greedy['max_tokens']} "
                 f"tokens): {verdict}: {greedy['identical']} identical, {greedy['near_ties']} near-tie partings, "
                 f"{greedy['failed']} unexplained"]
    for config in greedy["configs"]:
        rate = config["acceptance_rate"]
        lines.append(f"  {config['spec']} K={config['k']}: acceptance {rate:.3f} ({config['accepted']}/{config['drafted']})"
                     if rate is not None else f"  {config['spec']} K={config['k']}: nothing drafted")
        lines += [f"    prompt {o['prompt']}: {o['status']}: {o['detail']}" for o in config["outcomes"] if o["detail"]]
    return lines


def chi2_lines(chi2: dict | None) -> list[str]:
    if not chi2:
        return ["", "chi-square: not run or failed (see log.txt)"]
    lines = ["", f"chi-square, first two tokens at temperature {chi2['temperature']}, top-k {chi2['top_k']} "
                 f"(-ngl {chi2['n_gpu_layers']}): "
                 f"{'PASSED' if chi2['passed'] else 'FAILED'}; the broken-rule control "
                 f"{'was' if chi2['control_detected'] else 'was NOT'} detected"]
    for run in chi2["runs"]:
        lines.append(f"  {run['name']:<38} K={run['k']}  p={run['p_value']:.3g}  ({run['samples']} samples, {run['cells']} "
                     f"cells, expected to {run['expect']}: {'yes' if run['as_expected'] else 'NO'})")
    return lines


def bench_digest(report: dict | None) -> dict | None:
    """The figures the summary shows from one `speccli bench --json` report."""
    if not report:
        return None
    rows = []
    for result in report["results"]:
        overall = result["overall"]
        speedup = overall["speedup"]
        spec_rate = overall["speculative"]["wall_tokens_per_second"]
        rows.append({
            "label": result["label"], "speedup": speedup["median"] if speedup else None,
            "speculative_tokens_per_second": spec_rate["median"] if spec_rate else None,
            "acceptance": overall["acceptance_rate"], "alpha": overall["alpha"],
            "tokens_per_target_decode": overall["tokens_per_target_decode"],
            "mean_k": overall["mean_draft_length"],
            "predicted": overall["predicted"]["speedup"] if overall["predicted"] else None,
            "efficiency": overall["efficiency"],
        })
    baseline = report["results"][0]["overall"]["baseline"]["wall_tokens_per_second"] if report["results"] else None
    costs = report["costs"]
    return {
        "command": report["command"], "backend": report["environment"]["backend"],
        "target_n_gpu_layers": report["environment"]["target_n_gpu_layers"],
        "target_tokens_per_second": baseline["median"] if baseline else None,
        "c": costs["c"], "verify": {v["tokens"]: v["relative_to_1_token"] for v in costs["verify"]},
        "target_decode_1_ms": costs["target_decode_1_seconds"] * 1e3,
        "greedy_check": report["greedy_check"]["status"], "best": report["best"]["label"] if report["best"] else None,
        "cannot_pay": report["cannot_pay"], "rows": rows,
    }


def bench_lines(name: str, title: str, digest: dict | None) -> list[str]:
    if not digest:
        return ["", f"{name}: not run or failed (see log.txt)"]
    def num(value, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)
    verify = "  ".join(f"v({n})={ratio:.2f}" for n, ratio in sorted(digest["verify"].items(), key=lambda kv: int(kv[0])))
    lines = ["", f"{name}: {title} ({digest['backend']}, -ngl {digest['target_n_gpu_layers']}; greedy check "
                 f"{digest['greedy_check']})",
             f"  target alone {num(digest['target_tokens_per_second'], '.1f')} tok/s; 1-token decode "
             f"{digest['target_decode_1_ms']:.3f} ms; c={digest['c']:.3f}",
             f"  {verify}",
             f"  {'configuration':<20}{'speedup':>8}{'tok/s':>9}{'accept':>8}{'tok/dec':>8}{'mean K':>8}{'pred':>7}{'eff':>6}"]
    for row in digest["rows"]:
        lines.append(f"  {row['label']:<20}{num(row['speedup'], '.2f'):>8}{num(row['speculative_tokens_per_second'], '.1f'):>9}"
                     f"{num(row['acceptance'], '.3f'):>8}{num(row['tokens_per_target_decode'], '.2f'):>8}"
                     f"{num(row['mean_k'], '.2f'):>8}{num(row['predicted'], '.2f'):>7}{num(row['efficiency'], '.2f'):>6}")
    if digest["best"]:
        lines.append(f"  best: {digest['best']}")
    if digest["cannot_pay"]:
        lines.append(f"  {digest['cannot_pay']}")
    return lines


def speed_lines(speed: dict | None) -> list[str]:
    if not speed:
        return ["", "target alone, GPU against CPU: not run or failed (see log.txt)"]
    gpu, cpu = speed["gpu"], speed["cpu"]
    return ["", f"target alone, decode tok/s: GPU (-ngl {gpu['n_gpu_layers']}, {gpu['max_tokens']} tokens) "
                f"{gpu['tokens_per_second']:.1f}; CPU (-ngl 0, {cpu['max_tokens']} tokens) {cpu['tokens_per_second']:.1f}; "
                f"GPU/CPU {speed['gpu_over_cpu']:.1f}x",
                f"the target's weights read at {speed['gpu_weight_gb_per_second']:.0f} GB/s on the GPU (the H200's peak: 4,800)"] + [
        f"a draft of 4 (graphs {graphs}), ms a decode, first taking " + "; ".join(
            f"{first}: {', '.join(f'{ms:.3f}' for ms in times)}" for first, times in shapes.items())
        for graphs, shapes in speed.get("decode_shapes", {}).items()]


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


# --- command line ------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    models = commands.add_parser("models")
    models.add_argument("--scale", choices=sorted(SCALES), required=True)
    models.add_argument("--dir", type=Path, required=True)
    for name in ("load", "greedy", "chi2", "speed"):
        sub = commands.add_parser(name)
        sub.add_argument("--models", type=Path, required=True)
        sub.add_argument("--out", type=Path, required=True)
        if name != "speed":
            sub.add_argument("--ngl", type=int, default=99)
    commands.choices["chi2"].add_argument("--samples", type=int, default=3000)
    commands.choices["speed"].add_argument("--gpu-tokens", type=int, default=128)
    commands.choices["speed"].add_argument("--cpu-tokens", type=int, default=16)
    summary = commands.add_parser("summary")
    summary.add_argument("--work", type=Path, required=True)
    summary.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    steps: dict[str, Callable[[], tuple[Path, dict]]] = {
        "models": lambda: (args.dir / "models.json", write_models(SCALES[args.scale], args.dir)),
        "load": lambda: (args.out, load_check(args.models, args.ngl)),
        "greedy": lambda: (args.out, greedy_check(args.models, args.ngl)),
        "chi2": lambda: (args.out, chi2_check(args.models, args.ngl, args.samples)),
        "speed": lambda: (args.out, speed_check(args.models, args.gpu_tokens, args.cpu_tokens)),
    }
    if args.command == "summary":
        print("\n".join(summarize(args.work, args.out)))
        return 0
    path, result = steps[args.command]()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    # A check that ran but did not pass is a failed step (the report still has its figures).
    return 0 if result.get("passed", True) else 1


if __name__ == "__main__":
    sys.exit(main())
