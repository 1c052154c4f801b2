"""Measuring: timed generations from empty caches, interleaved rounds (target alone and every K), the
decode-cost profiler, and the run that ties them to the summaries, theory and greedy check.

For each prompt and run, one *round* generates with the target alone (A) and speculatively at every K
asked for (B_K), through the same backend, sampler and settings, with the same prompt, max tokens and
seed. Rounds alternate their order (A B1 B2 .. | .. B2 B1 A | A B1 ..) so machine drift hits both sides.
Every generation starts from empty KV caches (`Generator.reset()`), so neither side gets a cached-prompt
shortcut; `--warmup` unmeasured rounds absorb first-run effects (page-in, graph allocation).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from speccli.bench.greedy import GreedyChecker
from speccli.bench.prompts import PromptSet
from speccli.bench.report import BestK, Costs, GreedyCheck, KResult, Measurement, TaskSummary, VerifyCost
from speccli.bench.settings import BenchSettings
from speccli.bench.summary import Round, summarize
from speccli.bench.theory import best_k
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.core.stats import DoneEvent, TokenEvent
from speccli.drafting.model import ModelDrafter
from speccli.drafting.policy import FixedK
from speccli.errors import SpeccliError
from speccli.llama.model import Model


@dataclass
class Generation:
    measurement: Measurement
    tokens: list[int]  # the generated tokens, with the end-of-generation token if that ended it


def measure_generation(
    generator: Generator, prompt_tokens: Sequence[int], n_predict: int, *, mode: str, k: int, **labels
) -> Generation:
    """Generate from empty caches, timing the whole decode phase by the wall clock; labels: task,
    prompt_index, run, seed."""
    generator.reset()
    tokens: list[int] = []
    done: DoneEvent | None = None
    started = time.perf_counter()
    for event in generator.generate(prompt_tokens, GenerationLimits(max_tokens=n_predict)):
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
        elif isinstance(event, DoneEvent):
            done = event
    elapsed = time.perf_counter() - started
    if done.reason == "eog":
        # Keep the end-of-generation token (the engine keeps it last): ending is a choice the greedy
        # check must compare too.
        tokens.append(generator.tokens[-1])
    measurement = Measurement(
        mode=mode,
        k=k,
        reason=done.reason,
        decode_wall_seconds=max(elapsed - done.stats.prefill_seconds, 1e-9),
        stats=done.stats,
        **labels,
    )
    return Generation(measurement, tokens)


class CostProfiler:
    """Times the target's 1-token decode and (K+1)-token verify and the draft's 1-token decode, at the
    same cache position (the first prompt's). `sample()` takes one of each, sizes interleaved; it is
    called after every round, so the profile spans the whole run and drift hits it like the runs."""

    def __init__(self, target: Model, draft: Model, prompt_tokens: Sequence[int], ks: Iterable[int]) -> None:
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
        target_1 = median["target"]
        return Costs(
            position=len(self.context),
            reps=len(self.timings["target"]),
            target_decode_1_seconds=target_1,
            draft_decode_1_seconds=median["draft"],
            c=median["draft"] / target_1,
            verify=[
                VerifyCost(k=k, tokens=k + 1, seconds=median[f"verify{k}"], relative_to_1_token=median[f"verify{k}"] / target_1)
                for k in sorted(self.ks)
            ],
        )


@dataclass
class Measured:
    """What measuring produces; the report adds what was measured, where and how."""

    costs: Costs
    results: list[KResult]
    best_k: BestK | None
    greedy_check: GreedyCheck
    measurements: list[Measurement]


Progress = Callable[[str], None]  # advance by one generation, describing the next


def run_bench(
    target: Model, draft: Model, prompt_set: PromptSet, settings: BenchSettings, progress: Progress | None = None
) -> Measured:
    """Measure every round, profile the costs, check greedy outputs, and summarize each K."""
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
    check = GreedyChecker(applies=settings.greedy)

    def run_round(index: int, run: int, seed: int, reverse: bool) -> Round:
        task = prompt_set.prompts[index].task
        labels = {"task": task, "prompt_index": index, "run": run}
        order: list[int | None] = [None, *settings.ks]  # None: the target alone
        if reverse:
            order.reverse()
        done: dict[int | None, Generation] = {}
        for k in order:
            advance(f"{task} · {'target only' if k is None else f'K={k}'}")
            if k is None:
                generator = Generator(target, None, sampling, seed=seed)
            else:
                generator = Generator(target, ModelDrafter(draft), sampling, FixedK(k), seed)
            mode = "target" if k is None else "speculative"
            done[k] = measure_generation(
                generator, tokenized[index], settings.n_predict, mode=mode, k=k or 0, seed=seed, **labels
            )
        baseline = done.pop(None)
        if settings.greedy and run >= 0:
            for generation in done.values():
                check.check(
                    target, tokenized[index], baseline.measurement, baseline.tokens, generation.measurement, generation.tokens
                )
        return Round(task, index, run, baseline.measurement, {k: g.measurement for k, g in done.items()})

    profiler = CostProfiler(target, draft, tokenized[0], settings.ks)
    for warm in range(settings.warmup):
        run_round(0, -1 - warm, settings.seed, reverse=bool(warm % 2))
    advance("profiling decode costs")
    profiler.sample(reps=2)  # and one more after every round

    rounds: list[Round] = []
    for run in range(settings.runs):
        for index in range(len(prompt_set.prompts)):
            rounds.append(run_round(index, run, settings.seed + run, reverse=bool(len(rounds) % 2)))
            profiler.sample()
    costs = profiler.costs()

    results = [
        KResult(
            k=k,
            overall=summarize(rounds, k, costs),
            tasks=[
                TaskSummary(task=task, **dict(summarize([r for r in rounds if r.task == task], k, costs)))
                for task in prompt_set.tasks
            ],
        )
        for k in settings.ks
    ]
    return Measured(
        costs=costs,
        results=results,
        best_k=best_k(results),
        greedy_check=check.result(),
        measurements=[m for r in rounds for m in (r.baseline, *r.speculative.values())],
    )
