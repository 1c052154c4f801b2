"""Benchmark (not a test): the host loop alone, speccli against llama.cpp's own tools, on a model whose
decode is nearly free, so what is measured is everything around llama_decode.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/loop_overhead.py --rounds 3
    .venv/bin/python tests/benchmarks/loop_overhead.py --vocab 151936 --only speccli --profile greedy-k4
    .venv/bin/python tests/benchmarks/loop_overhead.py --files T.gguf,D.gguf --ngl 99 --k 4,8 --draft-max 4,8,16

Models: the project's own GGUF writer (tests/tiny_gguf.py) writes a one-layer model of width 16 at each
`--vocab` size (default 151,936, Qwen's, and 262,144, Gemma's) into `--workdir`; the same file is target
and draft. `--files TARGET,DRAFT` runs real files instead (with `--prompt`). Each round runs, per sampling
setting (greedy, and chat's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), in turn (odd
rounds in reverse order), with the round's own seed (42, 43, ...: sampled text, so what the drafts get
right, moves with it):

  speccli target      `Generator` without a drafter, as chat and bench run it
  speccli K=N         `Generator` with a `ModelDrafter`, `FixedK(N)`, for each N in `--k` (default 4)
  speccli model auto  the same with `AutoK` (`--spec model --k auto`), warm as below
  speccli auto        speccli's defaults: `--spec suffix+model --k auto`, its policy warm as a user's second
                      invocation finds it (what `auto` learnt kept between processes: a first run is
                      unmeasured, and each run goes on from the last; no store of earlier replies);
                      `--cold` starts each run from the priors
  speccli auto cold   the same from the priors in every run, its cost profile timed in it: a first reply
                      on a machine (or after `speccli remembered --clear`)
  speccli auto priors the same with the cost profile an earlier process timed: what `auto` knows of
                      this pair on this machine, less what it learnt of the text
  llama-completion    the target alone (-no-cnv --ignore-eos)
  llama-speculative-simple n-max N   --spec-type draft-simple, N from `--draft-max` (default 4); exact at
                                     T > 0 (a draft is kept where the target's own sample equals it)
  llama-speculative n-max N          at chat's defaults, the same; keeps the draft's most likely token by
                                     p/q, which is not the target's law (docs/exactness.md)

each generating `--n-predict` (256) tokens after the same prompt, `--threads` (2); llama.cpp ignores the
end token, and a speccli run that meets it stops the benchmark. `--ngl N` offloads N layers of both models
(speccli and llama.cpp alike; the device check's race runs this with every layer on the GPU).

Figures: tok/s over the generation (prompt apart); for speccli also the host time, i.e. the generation's
wall time minus the time inside llama_decode (timed by wrapping it), per target logit row and per step,
in µs, and its share of the generation's wall time; for llama.cpp the sampling time per token from its
own perf print (`common_perf_print: sampling time`, the target's sampler, over the tokens generated).
llama-completion's tok/s is over its total time less the prompt's; the speculative tools' over their own
"decoded N tokens in T seconds". Medians over rounds; each speccli row's ratios (medians of per-round
ratios) are to llama-completion (target alone), to each of llama.cpp's speculative tools at n-max N
(K=N) and at its best n-max (model auto, auto), and, for auto cold, to auto warm.

`--profile NAME` runs one speccli configuration (greedy-target, greedy-k4, chat-target, chat-k4) under
cProfile instead and prints its top functions by own time.

llama.cpp's tools, built from the vendored tree of llama-cpp-python 0.3.36 with .ci/setup.py's flags
(this CPU's instruction sets, never native), e.g.
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B /work/llama.cpp-tools -DGGML_NATIVE=OFF -DGGML_AVX=ON
        -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DLLAMA_CURL=OFF
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF
    nice -n 19 cmake --build /work/llama.cpp-tools -j2 --target llama-completion llama-speculative-simple llama-speculative
(`python3 .ci/setup.py --llama-cpp DIR` builds the same tools, and llama-cpp-python's own libraries with
them, in DIR/build/bin: then run with LLAMA_CPP_LIB_PATH=DIR/build/bin, as the device check does.)
`--tools` (default /work/llama.cpp-tools/bin) is where they are; rows whose tool is missing are left out.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402

from speccli.core.generator import GenerationLimits, Generator, PairCosts  # noqa: E402
from speccli.core.sampling import SamplingParams  # noqa: E402
from speccli.core.stats import DoneEvent, StepEvent  # noqa: E402
from speccli.drafting.policy import AutoK, FixedK  # noqa: E402
from speccli.drafting.registry import DEFAULT_SPEC  # noqa: E402
from speccli.drafting.specs import make_drafter  # noqa: E402
from speccli.llama.model import LoadOptions, Model  # noqa: E402

PROMPT = "the quick brown fox jumps over the lazy dog and then it runs far away into the woods"
SETTINGS = {
    "greedy": SamplingParams(temperature=0),
    "chat": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
}
SEED = 42


@dataclass
class Run:
    tokens_per_second: float
    host_us_per_row: float | None = None
    host_us_per_step: float | None = None
    host_share: float | None = None  # of the generation's wall time, outside llama_decode


def write_model(directory: Path, vocab: int) -> Path:
    from tests.tiny_gguf import TinyConfig, write_tiny_gguf  # needs `gguf`, the tests' set-up's (--dev): not --files'

    path = directory / f"loop-{vocab}.gguf"
    if not path.exists():
        write_tiny_gguf(path, TinyConfig(vocab_size=vocab, n_embd=16, n_layer=1, n_head=2, n_head_kv=1, n_ff=32,
                                         context_length=2048, seed=3))
    return path


class DecodeClock:
    """Wraps llama_cpp.llama_decode (speccli.llama.model calls it through the module) to time each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []  # (start, seconds)
        self._real = llama_cpp.llama_decode

    def __enter__(self) -> DecodeClock:
        def timed(ctx, batch):
            began = time.perf_counter()
            status = self._real(ctx, batch)
            self.calls.append((began, time.perf_counter() - began))
            return status

        llama_cpp.llama_decode = timed
        return self

    def __exit__(self, *exc_info) -> None:
        llama_cpp.llama_decode = self._real

    def seconds_after(self, moment: float) -> float:
        return sum(seconds for began, seconds in self.calls if began >= moment)


@dataclass
class Bench:
    target: Model
    draft: Model
    prompt: str
    n_predict: int
    tools: Path
    target_path: Path
    draft_path: Path
    threads: int = 2
    n_gpu_layers: int = 0

    seed: int = SEED  # each round's own: sampled text, and so what drafts it allows, varies with it
    warm: bool = True  # `auto` goes on from what it learnt in the runs before, per setting
    policies: dict[SamplingParams, AutoK] = field(default_factory=dict)
    costs: PairCosts | None = None  # "auto priors"' profile, timed in an earlier (unmeasured) run

    def speccli(self, sampling: SamplingParams, name: str, n_predict: int | None = None) -> Run:
        """speccli's target alone, the draft model at K=N or auto, or its defaults (--spec suffix+model --k auto)."""
        n_predict = n_predict or self.n_predict
        spec = None if name == "speccli target" else "model" if "K=" in name or "model" in name else DEFAULT_SPEC
        if name.startswith("speccli K="):
            policy = FixedK(int(name.split("=")[1]))
        elif name in ("speccli auto cold", "speccli auto priors") or not self.warm:
            policy = AutoK()
        else:  # each warm configuration goes on from what it learnt in its own runs before
            policy = self.policies.setdefault((sampling, name), AutoK())
        drafter = spec and make_drafter(spec, self.draft, self.target)
        costs = None
        if name == "speccli auto priors":
            costs = self.costs = self.costs or PairCosts(self.target, drafter)
            if costs.due(policy.profiled_sizes):  # timed apart, as the process before would have
                costs.profile(self.target.tokenizer.tokenize(self.prompt.encode()), policy.profiled_sizes, sampling)
        generator = Generator(self.target, drafter, sampling, spec and policy, seed=self.seed, costs=costs)
        prompt = self.target.tokenizer.tokenize(self.prompt.encode())
        steps = rows = 0
        with DecodeClock() as clock:
            started = time.perf_counter()
            for event in generator.generate(prompt, GenerationLimits(max_tokens=n_predict)):
                if isinstance(event, StepEvent):
                    steps += 1
                    rows += event.drafted + 1
                elif isinstance(event, DoneEvent):
                    done = event
            ended = time.perf_counter()
        generator.reset()
        if done.stats.generated != n_predict:
            raise RuntimeError(f"speccli stopped after {done.stats.generated} of {n_predict} tokens ({done.reason})")
        generating = ended - started - done.stats.prefill_seconds
        host = generating - clock.seconds_after(started + done.stats.prefill_seconds)
        return Run(done.stats.generated / generating, host / rows * 1e6, host / steps * 1e6, host / generating)

    def tool(self, sampling: SamplingParams, name: str) -> Run:
        tool, *draft_max = name.replace("n-max ", "").split()
        common = [str(self.tools / tool), "-m", str(self.target_path), "-p", self.prompt, "-n", str(self.n_predict),
                  "-t", str(self.threads), "-c", "2048", "--seed", str(self.seed), "--ignore-eos",
                  "-ngl", str(self.n_gpu_layers)]
        if sampling.greedy:
            common += ["--temp", "0"]
        else:
            common += ["--temp", str(sampling.temperature), "--top-k", str(sampling.top_k),
                       "--top-p", str(sampling.top_p), "--min-p", str(sampling.min_p)]
        if tool == "llama-completion":
            command = [*common, "-no-cnv"]
        else:
            draft_device = ["-devd", "none"] if self.n_gpu_layers == 0 else []
            command = [*common, "-md", str(self.draft_path), *draft_device, "-ngld", str(self.n_gpu_layers),
                       "--spec-type", "draft-simple", "--spec-draft-n-max", draft_max[0]]
        # llama.cpp logs from a thread of its own, and its last lines (the perf print) are now and then
        # lost at exit: such a run is run again.
        for _ in range(3):
            # errors="replace": a written model's tokens need not decode to UTF-8
            result = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=600)
            log = result.stdout + result.stderr
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {log[-2000:]}")
            # The speculative tools time their own decode loop; llama-completion's is its whole time
            # less the prompt's.
            patterns = ["sampling time =", *([r"decoded\s+\d+ tokens in"] if tool != "llama-completion" else
                                             ["total time =", "prompt eval time ="])]
            figures = [re.search(pattern + r"\s*([\d.]+)", log) for pattern in patterns]
            if all(figures):
                break
        else:
            raise RuntimeError(f"{' '.join(command)} printed no timings three times: {log[-2000:]}")
        sampling_ms, *times = (float(figure.group(1)) for figure in figures)
        if tool != "llama-completion":
            tokens, seconds = int(re.search(r"decoded\s+(\d+) tokens", log).group(1)), times[0]
        else:
            tokens, seconds = self.n_predict, (times[0] - times[1]) / 1e3
        return Run(tokens / seconds, sampling_ms / tokens * 1e3)


def configurations(tools: Path, only: set[str], draft_max: list[int], ks: list[int]) -> list[tuple[str, str]]:
    """(setting, configuration) pairs to run, in round order."""
    rows = []
    for setting in SETTINGS:
        if "speccli" in only:
            names = ["speccli target", *(f"speccli K={k}" for k in ks), "speccli model auto", "speccli auto", "speccli auto cold",
                     "speccli auto priors"]
            rows += [(setting, name) for name in names]
        if "llama" in only:
            rows.append((setting, "llama-completion"))
            # At T > 0 both: llama-speculative keeps the draft's most likely token by p/q, not the
            # target's law (docs/exactness.md); -simple keeps a draft where the target's own sample equals it.
            names = ["llama-speculative-simple"] if setting == "greedy" else ["llama-speculative", "llama-speculative-simple"]
            rows += [(setting, f"{tool} n-max {n}") for tool in names for n in draft_max]
    return [(setting, name) for setting, name in rows
            if name.startswith("speccli") or (tools / name.split()[0]).exists()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", default="151936,262144")
    parser.add_argument("--files", help="TARGET,DRAFT: real GGUF files instead of the written ones")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-predict", type=int, default=256)
    parser.add_argument("--draft-max", default="4", help="llama.cpp's --spec-draft-n-max values to run")
    parser.add_argument("--k", default="4", help="speccli's fixed draft lengths to run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ngl", type=int, default=0, help="layers of each model offloaded (99: all)")
    parser.add_argument("--only", default="speccli,llama")
    parser.add_argument("--tools", type=Path, default=Path("/work/llama.cpp-tools/bin"))
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "speccli-loop-overhead")
    parser.add_argument("--profile", choices=["greedy-target", "greedy-k4", "chat-target", "chat-k4"])
    parser.add_argument("--cold", action="store_true", help="speccli auto from its priors in every run")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    only, draft_max = set(args.only.split(",")), [int(n) for n in args.draft_max.split(",")]
    options = LoadOptions(n_ctx=2048, n_threads=args.threads, n_gpu_layers=args.ngl)
    if args.files:
        target_path, draft_path = map(Path, args.files.split(","))
        pairs = [(target_path.name, target_path, draft_path)]
    else:
        pairs = [(f"vocabulary {vocab:,}", path, path) for vocab in map(int, args.vocab.split(","))
                 for path in [write_model(args.workdir, vocab)]]
    for title, target_path, draft_path in pairs:
        target, draft = Model(target_path, options), Model(draft_path, options)
        bench = Bench(target, draft, args.prompt, args.n_predict, args.tools, target_path, draft_path,
                      threads=args.threads, n_gpu_layers=args.ngl, warm=not args.cold)
        if args.profile:
            setting, config = args.profile.split("-")
            bench.speccli(SETTINGS[setting], "speccli K=4" if config == "k4" else "speccli target")  # warm
            profile = cProfile.Profile()
            profile.runcall(bench.speccli, SETTINGS[setting], "speccli K=4" if config == "k4" else "speccli target")
            print(f"--- {title}, {args.profile}")
            pstats.Stats(profile).sort_stats("tottime").print_stats(18)
            continue
        order = configurations(args.tools, only, draft_max, [int(k) for k in args.k.split(",")])
        results: dict[tuple[str, str], list[Run]] = {key: [] for key in order}
        bench.speccli(SETTINGS["chat"], "speccli target", n_predict=16)  # warm the caches and pages
        if bench.warm and "speccli" in only:
            for setting in SETTINGS:  # a user's first invocation: what the measured ones go on from
                for name in ("speccli model auto", "speccli auto"):
                    bench.speccli(SETTINGS[setting], name)
        for round_index in range(args.rounds):
            bench.seed = SEED + round_index
            for setting, name in order if round_index % 2 == 0 else order[::-1]:
                run = bench.speccli(SETTINGS[setting], name) if name.startswith("speccli") else bench.tool(SETTINGS[setting], name)
                results[(setting, name)].append(run)
        target.close(), draft.close()
        report(title, results, args.rounds)


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def report(title: str, results: dict[tuple[str, str], list[Run]], rounds: int) -> None:
    """Each speccli row's ratios (medians of per-round ratios) to: llama-completion for the target alone;
    for K=N each speculative tool at n-max N, for model auto and auto each at its best n-max (by median);
    for auto cold and auto priors, auto (warm) in the same rounds."""
    print(f"\n{title}: medians of {rounds} interleaved rounds")
    print(f"{'setting':8} {'configuration':32} {'tok/s':>8} {'host µs/row':>12} {'host µs/step':>13} {'host share':>11}  ratios")

    def ratio(runs: list[Run], peer: tuple[str, str]) -> str:
        return f"{statistics.median(a.tokens_per_second / b.tokens_per_second for a, b in zip(runs, results[peer])):.2f}x"

    for (setting, name), runs in results.items():
        peers = [key for key in results if key[0] == setting and not key[1].startswith("speccli")]
        tools = sorted({key[1].split()[0] for key in peers if "speculative" in key[1]})
        versus = []
        if name == "speccli target":
            versus = [key for key in peers if key[1] == "llama-completion"]
        elif name.startswith("speccli K="):
            versus = [key for key in peers if key[1].endswith(f"n-max {name.split('=')[1]}")]
        elif name in ("speccli model auto", "speccli auto"):
            versus = [max((key for key in peers if key[1].split()[0] == tool),
                          key=lambda key: median([r.tokens_per_second for r in results[key]])) for tool in tools]
        elif name in ("speccli auto cold", "speccli auto priors"):
            versus = [(setting, "speccli auto")]
        ratios = ", ".join(f"{ratio(runs, key)} {key[1]}" for key in versus)
        row, step = median([r.host_us_per_row for r in runs]), median([r.host_us_per_step for r in runs])
        share = median([r.host_share for r in runs])
        print(f"{setting:8} {name:32} {median([r.tokens_per_second for r in runs]):8.1f} "
              f"{'' if row is None else f'{row:.0f}':>12} {'' if step is None else f'{step:.0f}':>13} "
              f"{'' if share is None else f'{share:.0%}':>11}  {ratios}")
    print("host µs/row: speccli, wall minus llama_decode per target logit row; llama.cpp, its sampler's time per token;"
          " host share: speccli's wall time outside llama_decode")


if __name__ == "__main__":
    main()
