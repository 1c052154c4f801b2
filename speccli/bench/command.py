"""`speccli bench`: speculative decoding against the target alone, measured fairly, and held against theory.

How a measurement is made
-------------------------
For each prompt and run, one *round* generates with the target alone (A) and speculatively at every K
asked for (B_K), through the same backend, sampler and settings, with the same prompt, max tokens and
seed. Rounds alternate their order (A B1 B2 .. | .. B2 B1 A | A B1 ..) so machine drift hits both sides.
Every generation starts from empty KV caches (`Generator.reset()`), so neither side gets a cached-prompt
shortcut; `--warmup` unmeasured rounds absorb first-run effects (page-in, graph allocation).

Prefill (the prompt) is timed apart from the decode phase. Decode tokens/s = generated / decode seconds,
per generation and from its own token count (end-of-generation may stop a run early: both counts are
reported). Speedup is the median, over rounds, of B_K tokens/s / A tokens/s of the same round.

Figures and formulas
--------------------
* acceptance rate         = accepted / drafted (draft tokens kept / draft tokens proposed)
* per-position acceptance = accepted_at[i] / drafted_at[i]: of the steps that drafted token i+1, the
                            share where it was kept (it is only kept if tokens 1..i were)
* alpha (estimate)        = conditional per-token acceptance, the geometric model's maximum-likelihood
                            estimate: accepted / judged, where a step judges its accepted drafts plus
                            the one it rejected, if any (drafts after a rejection are never judged)
* tokens per target decode = generated / steps: COUNTS the target's own correction/bonus token
* accepted per target decode = accepted / steps: draft tokens only
* c                       = draft 1-token decode time / target 1-token decode time
* v(K+1)                  = target (K+1)-token verify decode time / target 1-token decode time
                            (both profiled with Model.decode at the first prompt's position: medians of
                            samples taken after the warm-up and after every round; the same ratios
                            measured inside the runs are reported beside them as "in-run costs")
* predicted speedup (Leviathan et al. 2023, sec. 3.4, with the verify cost measured instead of assumed 1):

      E(alpha, K) = (1 - alpha^(K+1)) / (1 - alpha)     expected tokens per verify (K+1 when alpha = 1),
                                                        correction/bonus token included
      S_pred(K)   = E(alpha, K) / (K * c + v(K+1))      a step costs K draft decodes and one verify, in
                                                        units of the target's 1-token decode; the target
                                                        alone yields 1 token per such unit

  It ignores sampling, verification and bookkeeping time ("other"), and the draft's occasional
  2-token catch-up decode: measured / predicted = *efficiency* shows what those cost.

Honesty checks
--------------
At temperature 0 every speculative text must equal the target-only text of its round. Where they
part, `speccli.parting.find_parting` says whether the target's top-two logit gap there is within the
batched-vs-single logit difference measured for the model (a near-tie: allowed, reported) or not (a
bug: reported in red, recorded in the JSON, and the command exits with status 3). Sampling runs use
matched seeds but are not expected to produce equal text.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from speccli.errors import SpeccliError

SCHEMA_VERSION = 1
KIND = "speccli-bench"
BUILTIN_PROMPTS = "bench_prompts.jsonl"


class GreedyCheckFailed(SpeccliError):
    """Greedy speculative output parted from the target's own output where no near-tie explains it."""

    exit_code = 3


# --- input ----------------------------------------------------------------------------------------


def parse_k_spec(text: str, max_k: int | None = None) -> list[int]:
    """'4' -> [4]; '1,2,4,8' -> [1, 2, 4, 8]; '1-8' -> [1..8]; items may mix: '1-3,8'. Sorted, unique."""
    from speccli.core.generator import MAX_K

    max_k = MAX_K if max_k is None else max_k
    spec = text.strip()
    if not spec:
        raise SpeccliError("--k is empty; give a number (4), a list (1,2,4,8) or a range (1-8)")
    values: set[int] = set()
    for item in spec.split(","):
        item = item.strip()
        low_text, dash, high_text = item.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if dash else low
        except ValueError:
            raise SpeccliError(
                f"--k {text!r}: {item!r} is not a number or a range; give a number (4), a list (1,2,4,8) "
                "or a range (1-8)"
            ) from None
        if dash and low > high:
            raise SpeccliError(f"--k {text!r}: the range {item} runs backwards; write {high}-{low}")
        for value in (low, high):
            if not 1 <= value <= max_k:
                raise SpeccliError(f"--k {text!r}: K (draft tokens per step) must be between 1 and {max_k}, got {value}")
        values.update(range(low, high + 1))
    return sorted(values)


@dataclass(frozen=True)
class BenchPrompt:
    task: str
    prompt: str


@dataclass(frozen=True)
class PromptSet:
    source: str  # "built-in" or the file as given
    prompts: tuple[BenchPrompt, ...]

    @property
    def sha256(self) -> str:
        canonical = json.dumps([[p.task, p.prompt] for p in self.prompts], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(p.task for p in self.prompts))


def load_prompt_set(path: Path | None) -> PromptSet:
    """The built-in set, or a file: JSONL of {"task": ..., "prompt": ...} (task optional), or plain
    UTF-8 text with one prompt per line (task "text"; write a newline inside a prompt as \\n)."""
    if path is None:
        data = resources.files("speccli.data").joinpath(BUILTIN_PROMPTS).read_bytes()
        return PromptSet("built-in", _parse_prompts(data, BUILTIN_PROMPTS))
    if not path.exists():
        raise SpeccliError(f"prompts file {path}: no such file")
    if path.is_dir():
        raise SpeccliError(f"prompts file {path}: is a directory")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SpeccliError(f"prompts file {path}: cannot read it ({error.strerror})") from None
    return PromptSet(str(path), _parse_prompts(data, str(path)))


def _parse_prompts(data: bytes, name: str) -> tuple[BenchPrompt, ...]:
    if b"\x00" in data:
        raise SpeccliError(f"prompts file {name}: binary data, not JSONL or text (one prompt per line)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SpeccliError(
            f"prompts file {name}: not UTF-8 text (bad byte at offset {error.start}); expected JSONL or one prompt per line"
        ) from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise SpeccliError(f"prompts file {name}: no prompts in it (empty or only blank lines)")
    if lines[0][1].lstrip().startswith("{"):
        return tuple(_jsonl_prompt(line, number, name) for number, line in lines)
    return tuple(BenchPrompt("text", line.replace("\\n", "\n")) for _, line in lines)


def _jsonl_prompt(line: str, number: int, name: str) -> BenchPrompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise SpeccliError(f"prompts file {name}, line {number}: not valid JSON ({error.msg}); the file reads as JSONL") from None
    if not isinstance(record, dict):
        raise SpeccliError(f"prompts file {name}, line {number}: expected an object {{\"task\": ..., \"prompt\": ...}}")
    prompt, task = record.get("prompt"), record.get("task", "prompt")
    if not isinstance(prompt, str) or not prompt:
        raise SpeccliError(f"prompts file {name}, line {number}: \"prompt\" must be a non-empty string")
    if not isinstance(task, str) or not task:
        raise SpeccliError(f"prompts file {name}, line {number}: \"task\" must be a non-empty string")
    return BenchPrompt(task, prompt)


@dataclass(frozen=True)
class BenchSettings:
    ks: tuple[int, ...]
    n_predict: int = 64
    temperature: float = 0.0
    seed: int = 42
    runs: int = 2
    warmup: int = 1

    def validate(self) -> None:
        if self.runs < 1:
            raise SpeccliError(f"--runs must be >= 1, got {self.runs}")
        if self.warmup < 0:
            raise SpeccliError(f"--warmup must be >= 0, got {self.warmup}")
        if self.n_predict < 1:
            raise SpeccliError(f"--n-predict must be >= 1, got {self.n_predict}")
        if not self.temperature >= 0:
            raise SpeccliError(f"--temp must be >= 0 (0 is greedy), got {self.temperature}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_json_destination(path: Path | None) -> None:
    """Refuse an unusable --json path before spending minutes measuring."""
    if path is None:
        return
    if path.is_dir():
        raise SpeccliError(f"--json {path}: is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SpeccliError(f"--json {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise SpeccliError(f"--json {path}: cannot write in {parent}")


# --- measuring ------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One generation: target alone (mode "target", k 0) or speculative (mode "speculative")."""

    task: str
    prompt_index: int
    run: int
    mode: str
    k: int
    seed: int
    prompt_tokens: int
    generated: int
    reason: str
    prefill_seconds: float
    decode_seconds: float  # wall time of the decode phase: everything after prefill
    steps: int
    drafted: int
    accepted: int
    judged: int  # draft tokens the target ruled on: the accepted ones, plus the rejected one of each step
    accepted_at: list[int]
    drafted_at: list[int]
    draft_seconds: float
    target_seconds: float
    other_seconds: float  # decode_seconds - draft - target: sampling, verification, bookkeeping, text
    tokens: list[int] = field(default_factory=list, repr=False)

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        del record["tokens"]
        record["tokens_per_second"] = self.tokens_per_second
        return record


def measure_generation(generator, prompt_tokens: Sequence[int], n_predict: int, **labels: Any) -> Measurement:
    """Generate from empty caches and time it; labels: task, prompt_index, run, mode, seed."""
    from speccli.core.stats import DoneEvent, StepEvent, TokenEvent
    from speccli.core.generator import GenerationLimits

    generator.reset()
    tokens: list[int] = []
    done = None
    judged = 0
    started = time.perf_counter()
    for event in generator.generate(prompt_tokens, GenerationLimits(max_tokens=n_predict)):
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
        elif isinstance(event, StepEvent):
            judged += event.accepted + (event.accepted < event.drafted)
        elif isinstance(event, DoneEvent):
            done = event
    elapsed = time.perf_counter() - started
    if done.reason == "eog":
        # Keep the end-of-generation token (the engine keeps it last): ending is a choice the greedy
        # check must compare too.
        tokens.append(generator.tokens[-1])
    stats = done.stats
    decode_seconds = max(elapsed - stats.prefill_seconds, 1e-9)
    return Measurement(
        k=generator.k,
        prompt_tokens=len(prompt_tokens),
        generated=stats.generated,
        reason=done.reason,
        prefill_seconds=stats.prefill_seconds,
        decode_seconds=decode_seconds,
        steps=stats.steps,
        drafted=stats.drafted,
        accepted=stats.accepted,
        judged=judged,
        accepted_at=_padded(stats.positions.accepted_at, generator.k),
        drafted_at=_padded(stats.positions.drafted_at, generator.k),
        draft_seconds=stats.draft_seconds,
        target_seconds=stats.target_seconds,
        other_seconds=max(decode_seconds - stats.draft_seconds - stats.target_seconds, 0.0),
        tokens=tokens,
        **labels,
    )


def _padded(counts: list[int], k: int) -> list[int]:
    return counts + [0] * (k - len(counts))


@dataclass
class Costs:
    """Profiled decode times (medians), the inputs of the prediction."""

    position: int  # tokens in the cache when profiled
    reps: int
    target_1: float
    draft_1: float
    target_verify: dict[int, float]  # K -> seconds of a (K+1)-token target decode with K+1 logit rows

    @property
    def c(self) -> float:
        return self.draft_1 / self.target_1

    def verify_ratio(self, k: int) -> float:
        return self.target_verify[k] / self.target_1

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "reps": self.reps,
            "target_decode_1_seconds": self.target_1,
            "draft_decode_1_seconds": self.draft_1,
            "c": self.c,
            "verify": [
                {"k": k, "tokens": k + 1, "seconds": seconds, "relative_to_1_token": self.verify_ratio(k)}
                for k, seconds in sorted(self.target_verify.items())
            ],
        }


class CostProfiler:
    """Times the target's 1-token decode and (K+1)-token verify and the draft's 1-token decode, at the
    same cache position (the first prompt's). `sample()` takes one of each, sizes interleaved; it is
    called after every round, so the profile spans the whole run and drift hits it like the runs."""

    def __init__(self, target, draft, prompt_tokens: Sequence[int], ks: Iterable[int]) -> None:
        self.target, self.draft = target, draft
        self.ks = list(ks)
        self.context = list(prompt_tokens[:-1]) or list(prompt_tokens)
        self.filler = list(prompt_tokens) * (max(self.ks) // max(len(prompt_tokens), 1) + 2)
        self.sizes = {"draft": 1, "target": 1, **{f"verify{k}": k + 1 for k in self.ks}}
        self.timings: dict[str, list[float]] = {name: [] for name in self.sizes}

    def sample(self, reps: int = 1) -> None:
        for model in (self.target, self.draft):
            model.reset()
            model.decode(self.context, n_logit_rows=0)
        for _ in range(reps):
            for name, size in self.sizes.items():
                model = self.draft if name == "draft" else self.target
                started = time.perf_counter()
                model.decode(self.filler[:size], n_logit_rows=size)
                self.timings[name].append(time.perf_counter() - started)
                model.truncate(len(self.context))
        for model in (self.target, self.draft):
            model.reset()

    def costs(self) -> Costs:
        median = {name: statistics.median(values) for name, values in self.timings.items()}
        return Costs(
            position=len(self.context),
            reps=len(self.timings["target"]),
            target_1=median["target"],
            draft_1=median["draft"],
            target_verify={k: median[f"verify{k}"] for k in self.ks},
        )


# --- theory ---------------------------------------------------------------------------------------


def expected_tokens_per_verify(alpha: float, k: int) -> float:
    """E = (1 - alpha^(K+1)) / (1 - alpha): tokens one verify yields, its correction/bonus token included."""
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, verify_ratio: float) -> float:
    """S = E(alpha, K) / (K*c + v(K+1)), in units of the target's 1-token decode (Leviathan et al. 2023)."""
    return expected_tokens_per_verify(alpha, k) / (k * c + verify_ratio)


def estimate_alpha(accepted: int, judged: int) -> float | None:
    """Conditional per-token acceptance: kept / judged (a step judges its kept drafts and its first rejected one)."""
    return accepted / judged if judged else None


# --- aggregation ----------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


@dataclass
class Round:
    """One prompt, one run: the target-only generation and one speculative generation per K."""

    task: str
    prompt_index: int
    run: int
    baseline: Measurement
    speculative: dict[int, Measurement]


def summarize(rounds: Sequence[Round], k: int, costs: Costs) -> dict[str, Any]:
    """Every figure for one K over some rounds (a task's, or all)."""
    base = [r.baseline for r in rounds]
    spec = [r.speculative[k] for r in rounds]
    speedups = [s.tokens_per_second / b.tokens_per_second for b, s in zip(base, spec) if b.tokens_per_second > 0]
    drafted, accepted, steps = (sum(getattr(m, name) for m in spec) for name in ("drafted", "accepted", "steps"))
    generated = sum(m.generated for m in spec)
    accepted_at = [sum(m.accepted_at[i] for m in spec) for i in range(k)]
    drafted_at = [sum(m.drafted_at[i] for m in spec) for i in range(k)]
    alpha = estimate_alpha(accepted, sum(m.judged for m in spec))
    measured = statistics.median(speedups) if speedups else None
    prediction = None
    if alpha is not None:
        e = expected_tokens_per_verify(alpha, k)
        step_cost = k * costs.c + costs.verify_ratio(k)
        prediction = {"alpha": alpha, "tokens_per_verify": e, "step_cost": step_cost, "speedup": e / step_cost}
    base_decode = sum(m.decode_seconds for m in base)
    spec_decode = sum(m.decode_seconds for m in spec)
    base_steps = sum(m.steps for m in base)
    base_target_per_step = sum(m.target_seconds for m in base) / base_steps if base_steps else None
    observed = None
    if base_target_per_step and drafted and steps:
        observed = {
            "c": (sum(m.draft_seconds for m in spec) / drafted) / base_target_per_step,
            "verify_relative_to_1_token": (sum(m.target_seconds for m in spec) / steps) / base_target_per_step,
        }
        observed["predicted_speedup"] = (
            predicted_speedup(alpha, k, observed["c"], observed["verify_relative_to_1_token"]) if alpha is not None else None
        )
    return {
        "runs": len(rounds),
        "baseline": {
            "tokens_per_second": spread([m.tokens_per_second for m in base]),
            "prefill_seconds": spread([m.prefill_seconds for m in base]),
            "tokens": sum(m.generated for m in base),
            "tokens_per_run": [m.generated for m in base],
            "stop_reasons": sorted({m.reason for m in base}),
            "time_split": _time_split(base, base_decode),
        },
        "speculative": {
            "tokens_per_second": spread([m.tokens_per_second for m in spec]),
            "prefill_seconds": spread([m.prefill_seconds for m in spec]),
            "tokens": generated,
            "tokens_per_run": [m.generated for m in spec],
            "stop_reasons": sorted({m.reason for m in spec}),
            "time_split": _time_split(spec, spec_decode),
        },
        "speedup": spread(speedups),
        "drafted": drafted,
        "accepted": accepted,
        "target_decodes": steps,
        "acceptance_rate": accepted / drafted if drafted else None,
        "per_position_acceptance": [a / d if d else None for a, d in zip(accepted_at, drafted_at)],
        "alpha": alpha,
        "tokens_per_target_decode": generated / steps if steps else None,
        "accepted_per_target_decode": accepted / steps if steps else None,
        "observed_costs": observed,
        "predicted": prediction,
        "efficiency": measured / prediction["speedup"] if measured is not None and prediction else None,
    }


def _time_split(measurements: Sequence[Measurement], total: float) -> dict[str, float]:
    parts = {name: sum(getattr(m, f"{name}_seconds") for m in measurements) for name in ("draft", "target", "other")}
    result: dict[str, float] = {f"{name}_seconds": seconds for name, seconds in parts.items()}
    result.update({f"{name}_fraction": seconds / total if total else 0.0 for name, seconds in parts.items()})
    return result


def best_k(results: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The K with the highest median measured speedup, and why, in words (None for a single K)."""
    scored = [r for r in results if r["overall"]["speedup"]]
    if len(scored) < 2:
        return None
    best = max(scored, key=lambda r: r["overall"]["speedup"]["median"])
    k, overall = best["k"], best["overall"]
    reason = f"K={k} has the highest measured speedup: {_yield_phrase(best, named=False)}"
    neighbours = [r for r in scored if r["k"] < k][-1:] + [r for r in scored if r["k"] > k][:1]
    if neighbours:
        reason += "; against " + " and ".join(_yield_phrase(r) for r in neighbours)
        reason += (
            ". Smaller K yields fewer tokens per verify; larger K pays K draft steps and a wider verify for "
            "drafts that are more and more often rejected"
        )
    predicted = [r for r in scored if r["overall"]["predicted"]]
    if predicted:
        theory = max(predicted, key=lambda r: r["overall"]["predicted"]["speedup"])["k"]
        if theory == k:
            reason += f". The prediction from measured alpha, c and v also puts K={k} first"
        else:
            reason += f". The prediction from measured alpha, c and v puts K={theory} first instead"
    close = [r["k"] for r in scored if r is not best and r["overall"]["speedup"]["max"] >= overall["speedup"]["min"]]
    if close:
        reason += f"; K={','.join(map(str, close))} overlap(s) its min-max range, so more --runs may change the order"
    return {"k": k, "speedup": overall["speedup"]["median"], "reason": reason + "."}


def _yield_phrase(result: dict[str, Any], named: bool = True) -> str:
    overall = result["overall"]
    pred = overall["predicted"]
    text = (f"K={result['k']}: " if named else "") + f"{overall['speedup']['median']:.2f}x measured"
    if pred:
        text += (
            f" (alpha {pred['alpha']:.2f}: {pred['tokens_per_verify']:.2f} tokens per verify for "
            f"{pred['step_cost']:.2f} target-decode costs, predicted {pred['speedup']:.2f}x)"
        )
    return text


# --- the whole run --------------------------------------------------------------------------------


@dataclass
class GreedyCheck:
    applies: bool
    checked: int = 0
    identical: int = 0
    partings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        if not self.applies:
            return "not_applicable"
        if any(p["near_tie"] is False for p in self.partings):
            return "failed"
        return "near_tie" if self.partings else "passed"

    def to_json(self) -> dict[str, Any]:
        return {
            "applies": self.applies,
            "status": self.status,
            "checked": self.checked,
            "identical": self.identical,
            "partings": self.partings,
        }


Progress = Callable[[str], None]  # advance by one generation, describing the next


def run_bench(target, draft, prompt_set: PromptSet, settings: BenchSettings, progress: Progress | None = None) -> dict[str, Any]:
    """Measure, check and summarize; returns the "results" part of the report (see bench_schema.json)."""
    from speccli.core.generator import Generator
    from speccli.core.sampling import SamplingParams

    sampling = SamplingParams(temperature=settings.temperature)
    advance = progress or (lambda _description: None)
    tokenized = [target.tokenizer.tokenize(p.prompt) for p in prompt_set.prompts]
    limit = min(target.n_ctx, draft.n_ctx)
    longest = max(len(t) for t in tokenized)
    if longest + settings.n_predict + max(settings.ks) + 1 > limit:
        raise SpeccliError(
            f"the longest prompt ({longest} tokens) + --n-predict {settings.n_predict} + K {max(settings.ks)} "
            f"does not fit the context of {limit} tokens; raise --ctx or lower --n-predict"
        )

    def run_round(index: int, run: int, seed: int, reverse: bool) -> Round:
        task = prompt_set.prompts[index].task
        labels = {"task": task, "prompt_index": index, "run": run, "seed": seed}
        order: list[int | None] = [None, *settings.ks]  # None: the target alone
        if reverse:
            order.reverse()
        done: dict[int | None, Measurement] = {}
        for k in order:
            advance(f"{task} · {'target only' if k is None else f'K={k}'}")
            generator = Generator(target, None if k is None else draft, sampling, k or 0, seed)
            done[k] = measure_generation(
                generator, tokenized[index], settings.n_predict, mode="target" if k is None else "speculative", **labels
            )
        return Round(task, index, run, done.pop(None), done)

    profiler = CostProfiler(target, draft, tokenized[0], settings.ks)
    for warm in range(settings.warmup):
        run_round(0, -1 - warm, settings.seed, reverse=bool(warm % 2))
    advance("profiling decode costs")
    profiler.sample(reps=2)  # and one more after every round

    rounds: list[Round] = []
    check = GreedyCheck(applies=settings.greedy)
    number = 0
    for run in range(settings.runs):
        for index in range(len(prompt_set.prompts)):
            this = run_round(index, run, settings.seed + run, reverse=bool(number % 2))
            number += 1
            rounds.append(this)
            profiler.sample()
            if settings.greedy:
                _check_round(target, tokenized[index], this, check)
    costs = profiler.costs()

    tasks = prompt_set.tasks
    results = []
    for k in settings.ks:
        results.append({
            "k": k,
            "overall": summarize(rounds, k, costs),
            "tasks": [{"task": t, **summarize([r for r in rounds if r.task == t], k, costs)} for t in tasks],
        })
    measurements = [m.to_json() for r in rounds for m in (r.baseline, *r.speculative.values())]
    return {
        "costs": costs.to_json(),
        "results": results,
        "best_k": best_k(results),
        "greedy_check": check.to_json(),
        "measurements": measurements,
    }


def _check_round(target, prompt_tokens: list[int], round_: Round, check: GreedyCheck) -> None:
    from speccli.core.parting import find_parting

    reference = round_.baseline.tokens
    for k, measurement in round_.speculative.items():
        check.checked += 1
        candidate = measurement.tokens
        if candidate == reference:
            check.identical += 1
            continue
        parting = find_parting(target, prompt_tokens, reference, candidate, k)
        entry = {"task": round_.task, "prompt_index": round_.prompt_index, "run": round_.run, "k": k}
        if parting is not None:
            entry.update(
                index=parting.index,
                target_token=parting.reference_token,
                speculative_token=parting.candidate_token,
                top_two_gap=parting.top_two_gap,
                tolerance=parting.tolerance,
                near_tie=bool(parting.near_tie),
                description=parting.describe(),
            )
        else:
            # Equal as far as both go, yet one is longer: with the end-of-generation token kept and the
            # same token limit on both sides, nothing explains that, so it fails like any other parting.
            shorter = min(len(reference), len(candidate))
            entry.update(
                index=shorter,
                target_token=None,
                speculative_token=None,
                top_two_gap=None,
                tolerance=None,
                near_tie=False,
                description=(
                    f"outputs agree for {shorter} tokens, then one side stops ({round_.baseline.reason} alone vs "
                    f"{measurement.reason} speculative) where the other goes on: not a near-tie"
                ),
            )
        check.partings.append(entry)


# --- environment and the report -------------------------------------------------------------------


def file_info(name: str, path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"name": name, "path": str(path), "size_bytes": stat.st_size, "sha256": cached_sha256(path)}


def _sha_cache_file() -> Path:
    from speccli.util.cache import model_cache_dir

    return model_cache_dir().parent / "sha256-cache.json"


def cached_sha256(path: Path) -> str:
    """sha256 of a file, remembered by (resolved path, size, mtime) so a 1 GB model is hashed once."""
    from speccli.util.hashing import sha256_of

    resolved = path.resolve()
    stat = resolved.stat()
    key = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_file = _sha_cache_file()
    try:
        cache = json.loads(cache_file.read_text())
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache.get(key), str):
        return cache[key]
    digest = sha256_of(resolved)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{resolved}|")}
    cache[key] = digest
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(cache_file, json.dumps(cache, indent=1))
    except OSError:
        pass  # a cache we cannot write only costs the hash next time
    return digest


def environment(threads: int | None, target_layers: int, draft_layers: int) -> dict[str, Any]:
    from speccli import __version__
    from speccli.llama.build import backend_info

    info = backend_info()
    return {
        "speccli": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "llama_cpp_python": info.llama_cpp_python_version,
        "backend": info.backend,
        "gpu_offload_supported": info.gpu_offload,
        "system_info": info.system_info,
        "cpu_count": os.cpu_count() or 1,
        "threads": threads or os.cpu_count() or 1,
        "target_n_gpu_layers": target_layers,
        "draft_n_gpu_layers": draft_layers,
    }


def build_report(
    *,
    command: str,
    settings: BenchSettings,
    n_ctx: int,
    env: dict[str, Any],
    pair_name: str | None,
    target: dict[str, Any],
    draft: dict[str, Any],
    prompt_set: PromptSet,
    measured: dict[str, Any],
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "settings": {
            "k": list(settings.ks),
            "n_predict": settings.n_predict,
            "temperature": settings.temperature,
            "greedy": settings.greedy,
            "seed": settings.seed,
            "runs": settings.runs,
            "warmup": settings.warmup,
            "n_ctx": n_ctx,
        },
        "environment": env,
        "models": {"pair": pair_name, "target": target, "draft": draft},
        "prompts": {
            "source": prompt_set.source,
            "sha256": prompt_set.sha256,
            "count": len(prompt_set.prompts),
            "tasks": prompt_set.tasks,
        },
        "notes": {
            "tokens_per_target_decode": "counts the target's own correction or bonus token",
            "predicted": "a prediction, not a measurement: (1 - alpha^(K+1)) / (1 - alpha) / (K*c + v(K+1))",
            "efficiency": "measured median speedup / predicted speedup",
            "tokens_per_second": "decode phase only (prefill timed apart), each run from its own token count",
        },
        **measured,
    }


def write_text_atomically(path: Path, text: str) -> None:
    """Readers never see a half-written file (the registry's builds use the same mechanism)."""
    from speccli.util.files import build_atomically

    build_atomically(path, lambda partial: partial.write_text(text, encoding="utf-8"))


def write_report(path: Path, report: dict[str, Any]) -> None:
    try:
        write_text_atomically(path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    except OSError as error:
        raise SpeccliError(f"--json {path}: cannot write it ({error.strerror})") from None


def load_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpeccliError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SpeccliError(f"{path}: not a speccli bench JSON report ({error})") from None
    if not isinstance(report, dict) or report.get("kind") != KIND:
        raise SpeccliError(f"{path}: not a speccli bench JSON report (written by `speccli bench --json`)")
    if report.get("schema_version") != SCHEMA_VERSION:
        raise SpeccliError(f"{path}: bench report schema version {report.get('schema_version')}, this speccli reads {SCHEMA_VERSION}")
    return report


# --- rendering ------------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def _spread_text(s: dict[str, float] | None, digits: int = 1, suffix: str = "") -> str:
    if not s:
        return "–"
    return f"{s['median']:.{digits}f}{suffix} [dim]({s['min']:.{digits}f}–{s['max']:.{digits}f})[/dim]"


def _size(n: int) -> str:
    from speccli.util.format import format_size

    return format_size(n)


def render_report(report: dict[str, Any], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    settings, env, models = report["settings"], report["environment"], report["models"]
    costs = report["costs"]
    mode = "greedy" if settings["greedy"] else f"temperature {settings['temperature']:g}, seed {settings['seed']}"
    pair = f"pair {escape(models['pair'])}" if models["pair"] else "ad-hoc pair"
    console.print(
        f"[bold]speccli bench[/bold] · {pair} · K={','.join(map(str, settings['k']))} · {mode} · "
        f"{settings['n_predict']} new tokens max · {settings['runs']} run(s) + {settings['warmup']} warm-up · "
        f"{report['prompts']['count']} prompt(s) ({escape(report['prompts']['source'])})"
    )
    console.print(f"  [dim]{escape(report['command'])}[/dim]", soft_wrap=True)
    for role in ("target", "draft"):
        model = models[role]
        console.print(f"  {role:<6} {escape(model['name'])} ({_size(model['size_bytes'])}, sha256 {model['sha256'][:12]})")
    offload = (
        f"ngl {env['target_n_gpu_layers']}/{env['draft_n_gpu_layers']}" if env["gpu_offload_supported"] else "no GPU offload"
    )
    console.print(f"  {env['backend']} · {env['threads']} threads · {offload} · llama-cpp-python {env['llama_cpp_python']}")
    verify = ", ".join(f"K={v['k']}: {v['relative_to_1_token']:.2f}" for v in costs["verify"])
    console.print(
        f"  profiled: target 1-token decode {costs['target_decode_1_seconds'] * 1e3:.1f} ms, draft "
        f"{costs['draft_decode_1_seconds'] * 1e3:.1f} ms → c = {costs['c']:.3f}; "
        f"(K+1)-token verify / 1-token decode: {verify}"
    )
    results = report["results"]
    if len(results) == 1:
        _render_single(results[0], console, Table)
    else:
        _render_sweep(results, report.get("best_k"), console, Table)
    console.print(
        "[dim]tok/s: decode phase, median (min–max) over runs; speedup: median of per-round ratios. "
        "tok/verify counts the target's correction/bonus token. "
        "predicted = (1−α^(K+1))/(1−α) ÷ (K·c + v(K+1)) from measured α, c, v — a prediction, not a measurement; "
        "efficiency = measured ÷ predicted.[/dim]"
    )
    _render_check(report["greedy_check"], console)


def _task_row(label: str, s: dict[str, Any], bold: bool = False) -> list[str]:
    pred = s["predicted"]
    row = [
        label,
        f"{s['baseline']['tokens']}/{s['speculative']['tokens']}",
        _spread_text(s["baseline"]["tokens_per_second"]),
        _spread_text(s["speculative"]["tokens_per_second"]),
        _spread_text(s["speedup"], 2, "×"),
        _f(s["acceptance_rate"]),
        _f(s["alpha"]),
        _f(s["tokens_per_target_decode"]),
        _f(pred["speedup"] if pred else None, 2, "×"),
        _f(s["efficiency"]),
    ]
    return [f"[bold]{cell}[/bold]" for cell in row] if bold else row


def _new_table(Table, title: str, first: str):
    table = Table(title=title, title_justify="left", header_style="bold")
    for name, justify in (
        (first, "left"),
        ("tokens\nA/B", "right"),
        ("target-only\ntok/s", "right"),
        ("speculative\ntok/s", "right"),
        ("speedup", "right"),
        ("accept\nrate", "right"),
        ("α\n(est.)", "right"),
        ("tok/\nverify", "right"),
        ("predicted\nspeedup", "right"),
        ("effi-\nciency", "right"),
    ):
        table.add_column(name, justify=justify)
    return table


def _render_single(result: dict[str, Any], console, Table) -> None:
    k = result["k"]
    table = _new_table(Table, f"K = {k}  (A = target only, B = speculative)", "task")
    for task in result["tasks"]:
        table.add_row(*_task_row(task["task"], task))
    table.add_section()
    table.add_row(*_task_row("overall", result["overall"], bold=True))
    console.print(table)
    _render_details(result, console)


def _render_details(result: dict[str, Any], console) -> None:
    overall = result["overall"]
    positions = "  ".join(f"{i + 1}: {_f(a)}" for i, a in enumerate(overall["per_position_acceptance"]))
    console.print(f"  per-position acceptance (K={result['k']}): {positions}")
    console.print(
        f"  accepted draft tokens per target decode: {_f(overall['accepted_per_target_decode'])} "
        f"(+1 correction/bonus = {_f(overall['tokens_per_target_decode'])} tokens per target decode)"
    )
    split = overall["speculative"]["time_split"]
    base_split = overall["baseline"]["time_split"]
    console.print(
        f"  decode time, speculative: draft {split['draft_fraction']:.0%} · target {split['target_fraction']:.0%} · "
        f"other {split['other_fraction']:.0%}   target only: target {base_split['target_fraction']:.0%} · "
        f"other {base_split['other_fraction']:.0%}"
    )
    observed = overall["observed_costs"]
    if observed:
        console.print(
            f"  in-run costs (from the runs' own draft/target times): c = {observed['c']:.3f}, verify / 1-token "
            f"decode = {observed['verify_relative_to_1_token']:.2f} → predicted {_f(observed['predicted_speedup'], 2, '×')}"
        )


def _render_sweep(results: list[dict[str, Any]], best: dict[str, Any] | None, console, Table) -> None:
    table = _new_table(Table, "overall, by K  (A = target only, B = speculative)", "K")
    for result in results:
        table.add_row(*_task_row(str(result["k"]), result["overall"], bold=best is not None and result["k"] == best["k"]))
    console.print(table)
    tasks = Table(title="speedup by task and K (median)", title_justify="left", header_style="bold")
    tasks.add_column("task")
    for result in results:
        tasks.add_column(f"K={result['k']}", justify="right")
    for i, task in enumerate(results[0]["tasks"]):
        tasks.add_row(task["task"], *(_f(r["tasks"][i]["speedup"]["median"] if r["tasks"][i]["speedup"] else None, 2, "×") for r in results))
    console.print(tasks)
    console.print(render_chart(results))
    if best:
        console.print(f"[bold green]best K = {best['k']}[/bold green]: {best['reason']}")
        chosen = next(r for r in results if r["k"] == best["k"])
        _render_details(chosen, console)


def render_chart(results: list[dict[str, Any]], width: int = 40) -> str:
    """Speedup (█ measured, ┆ at the predicted value) and acceptance (▒) against K, as text bars."""
    speedups = [r["overall"]["speedup"]["median"] if r["overall"]["speedup"] else 0.0 for r in results]
    predicted = [r["overall"]["predicted"]["speedup"] if r["overall"]["predicted"] else 0.0 for r in results]
    top = max([*speedups, *predicted, 1.0])
    lines = [f"speedup against K  (█ measured, ┆ predicted, │ = 1.0×; scale 0–{top:.2f}×)"]
    one = round(width / top)
    for result, s, p in zip(results, speedups, predicted):
        bar = list("█" * round(s / top * width) + " " * width)[:width]
        if p:
            bar[min(round(p / top * width), width) - 1] = "┆"
        if 0 < one <= width and bar[one - 1] == " ":
            bar[one - 1] = "│"
        lines.append(f"K={result['k']:<3}{''.join(bar)} {s:.2f}×  (pred. {p:.2f}×)")
    lines.append("acceptance rate against K  (▒, scale 0–1)")
    for result in results:
        rate = result["overall"]["acceptance_rate"] or 0.0
        lines.append(f"K={result['k']:<3}{'▒' * round(rate * width):<{width}} {rate:.2f}")
    return "\n".join(lines)


def _render_check(check: dict[str, Any], console) -> None:
    if not check["applies"]:
        console.print("  text check: sampling run (matched seeds); equal text is not expected, so none is checked")
        return
    status = check["status"]
    if status == "passed":
        console.print(f"  greedy check: [green]{check['identical']}/{check['checked']} speculative outputs identical to the target's own[/green]")
        return
    for parting in check["partings"]:
        where = f"{parting['task']} (prompt {parting['prompt_index']}, run {parting['run']}, K={parting['k']})"
        failed = parting["near_tie"] is False
        label = "PARTING (not a near-tie)" if failed else "near-tie parting"
        style = "bold red" if failed else "yellow"
        console.print(f"  [{style}]{label}[/{style}] {where}: {parting['description']}")
    summary = f"{check['identical']}/{check['checked']} identical, {len(check['partings'])} parted"
    if status == "failed":
        console.print(f"[bold red]greedy check FAILED: {summary}; speculative output is not the target's own. This is a bug.[/bold red]")
    else:
        console.print(f"  greedy check: [yellow]{summary}, none where the target's top two logits are clearly apart (allowed)[/yellow]")


def render_comparison(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    differences = []
    for label, getter in (
        ("target sha256", lambda r: r["models"]["target"]["sha256"][:12]),
        ("draft sha256", lambda r: r["models"]["draft"]["sha256"][:12]),
        ("prompt set", lambda r: r["prompts"]["sha256"][:12]),
        ("temperature", lambda r: r["settings"]["temperature"]),
        ("n_predict", lambda r: r["settings"]["n_predict"]),
        ("backend", lambda r: r["environment"]["backend"]),
        ("threads", lambda r: r["environment"]["threads"]),
        ("speccli", lambda r: r["environment"]["speccli"]),
        ("llama-cpp-python", lambda r: r["environment"]["llama_cpp_python"]),
    ):
        left, right = getter(a), getter(b)
        if left != right:
            differences.append(f"{label}: {left} → {right}")
    console.print(f"[bold]A[/bold] = {escape(names[0])} ({a['created']})   [bold]B[/bold] = {escape(names[1])} ({b['created']})")
    console.print("  differs: " + (escape("; ".join(differences)) if differences else "nothing in models, prompts, settings or environment"))
    by_k_a = {r["k"]: r["overall"] for r in a["results"]}
    by_k_b = {r["k"]: r["overall"] for r in b["results"]}
    table = Table(header_style="bold")
    for name in ("K", "speculative tok/s A → B", "target-only tok/s A → B", "speedup A → B", "acceptance A → B", "efficiency A → B"):
        table.add_column(name, justify="right")
    for k in sorted(set(by_k_a) | set(by_k_b)):
        left, right = by_k_a.get(k), by_k_b.get(k)

        def pick(summary, path, digits=2):
            if summary is None:
                return "–"
            value = summary
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            return _f(value, digits)

        table.add_row(
            str(k),
            f"{pick(left, ('speculative', 'tokens_per_second', 'median'), 1)} → {pick(right, ('speculative', 'tokens_per_second', 'median'), 1)}",
            f"{pick(left, ('baseline', 'tokens_per_second', 'median'), 1)} → {pick(right, ('baseline', 'tokens_per_second', 'median'), 1)}",
            f"{pick(left, ('speedup', 'median'))} → {pick(right, ('speedup', 'median'))}",
            f"{pick(left, ('acceptance_rate',))} → {pick(right, ('acceptance_rate',))}",
            f"{pick(left, ('efficiency',))} → {pick(right, ('efficiency',))}",
        )
    console.print(table)


# --- the command ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchRequest:
    pair: str | None
    target: str | None
    draft: str | None
    k_spec: str | None
    settings: BenchSettings  # ks filled in from k_spec (or the pair's k) by run_command
    prompts_file: Path | None
    json_path: Path | None
    n_ctx: int
    threads: int | None
    target_n_gpu_layers: int | None
    draft_n_gpu_layers: int | None
    config: Path | None


def _console(stderr: bool = False):
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if not stderr and not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, 132))
    return console


def reproducing_command(request: BenchRequest, settings: BenchSettings) -> str:
    """The command line that repeats this measurement, every default spelled out."""
    import shlex

    words = ["speccli", "bench"] + ([request.pair] if request.pair else [])
    for option, value in (
        ("--target", request.target),
        ("--draft", request.draft),
        ("--k", ",".join(map(str, settings.ks))),
        ("--n-predict", settings.n_predict),
        ("--temp", f"{settings.temperature:g}"),
        ("--seed", settings.seed),
        ("--runs", settings.runs),
        ("--warmup", settings.warmup),
        ("--prompts", request.prompts_file),
        ("--ctx", request.n_ctx),
        ("--threads", request.threads),
        ("--ngl", request.target_n_gpu_layers),
        ("--ngl-draft", request.draft_n_gpu_layers),
        ("--config", request.config),
    ):
        if value is not None:
            words += [option, str(value)]
    return shlex.join(words)


def run_command(request: BenchRequest) -> None:
    """Validate everything cheap first (nothing is loaded or written on bad input), then measure."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from speccli.models.pair import PairRequest, open_pair

    ks = parse_k_spec(request.k_spec) if request.k_spec is not None else None
    settings = request.settings
    settings.validate()
    pair_request = PairRequest(
        pair=request.pair,
        target=request.target,
        draft=request.draft,
        config=request.config,
        n_ctx=request.n_ctx,
        n_threads=request.threads,
        target_n_gpu_layers=request.target_n_gpu_layers,
        draft_n_gpu_layers=request.draft_n_gpu_layers,
    )
    pair_request.validate()
    prompt_set = load_prompt_set(request.prompts_file)
    check_json_destination(request.json_path)

    with open_pair(pair_request) as loaded:
        resolved = loaded.resolved
        settings = BenchSettings(**{**asdict(settings), "ks": tuple(ks or [resolved.k])})
        per_round = 1 + len(settings.ks)
        total = (settings.warmup + settings.runs * len(prompt_set.prompts)) * per_round + 1
        err = _console(stderr=True)
        with Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as bar:
            task_id = bar.add_task("warming up", total=total)
            first = [True]

            def advance(description: str) -> None:
                if not first[0]:
                    bar.advance(task_id)
                first[0] = False
                bar.update(task_id, description=description)

            measured = run_bench(loaded.target, loaded.draft, prompt_set, settings, advance)
            bar.update(task_id, completed=total)
        report = build_report(
            command=reproducing_command(request, settings),
            settings=settings,
            n_ctx=request.n_ctx,
            env=environment(request.threads, loaded.target.options.n_gpu_layers, loaded.draft.options.n_gpu_layers),
            pair_name=resolved.name,
            target=file_info(resolved.target_name, resolved.target_path),
            draft=file_info(resolved.draft_name, resolved.draft_path),
            prompt_set=prompt_set,
            measured=measured,
        )
    render_report(report, _console())
    if request.json_path is not None:
        write_report(request.json_path, report)
        _console().print(f"  wrote {request.json_path}")
    check = report["greedy_check"]
    if check["status"] == "failed":
        bad = sum(p["near_tie"] is False for p in check["partings"])
        raise GreedyCheckFailed(
            f"greedy check failed: {bad} speculative output(s) parted from the target's own where no near-tie explains it"
        )


def compare_command(first: Path, second: Path) -> None:
    a, b = load_report(first), load_report(second)
    render_comparison(a, b, (str(first), str(second)), _console())
