"""Measuring: timed generations from empty caches, interleaved rounds (target alone and every
configuration), the decode-cost profiler, and the run that ties them to the summaries, theory, the
cannot-pay verdict and the greedy check.

For each prompt and run, one *round* generates with the target alone (A) and speculatively with every
configuration asked for (B_i: a draft source and K, auto included), through the same backend, sampler
and settings, with the same prompt, max tokens and seed. Rounds alternate their order
(A B1 B2 .. | .. B2 B1 A | A B1 ..) so machine drift hits every side alike. Every generation starts
from empty KV caches and a fresh drafter (a new `Generator`), so no side gets a cached-prompt
shortcut. Each configuration keeps one K policy for the whole bench, as one chat session or server
does: `auto` profiles its costs once, during the first prefill (timed apart), and what it learns of
acceptance and costs carries from one prompt to the next; the warm-up rounds are where it starts. `--warmup` unmeasured rounds absorb first-run effects (page-in, graph
allocation).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from speccli.bench.greedy import GreedyChecker
from speccli.bench.prompts import PromptSet
from speccli.bench.report import Best, ConfigResult, Costs, GreedyCheck, Measurement, TaskSummary, VerifyCost
from speccli.bench.settings import BenchSettings, Configuration
from speccli.bench.summary import Round, summarize
from speccli.bench.theory import best_configuration
from speccli.bench.verdict import cannot_pay
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.stats import DoneEvent, TokenEvent
from speccli.drafting.specs import make_drafter, make_policy
from speccli.errors import SpeccliError
from speccli.llama.model import Model, shared_context
from speccli.util.interrupts import terminated
from speccli.validation import AUTO_K, require_draft_model


@dataclass
class Generation:
    measurement: Measurement
    tokens: list[int]  # the generated tokens, with the end-of-generation token if that ended it


def measure_generation(generator: Generator, prompt_tokens: Sequence[int], n_predict: int, **labels) -> Generation:
    """Generate from empty caches, timing the whole decode phase by the wall clock; labels: task,
    prompt_index, run, seed, mode, spec, k."""
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
        reason=done.reason,
        decode_wall_seconds=max(elapsed - done.stats.prefill_seconds, 1e-9),
        stats=done.stats,
        **labels,
    )
    return Generation(measurement, tokens)


# Verify widths profiled for `auto` (K = n - 1 for n = 2, 4, 8, 16 tokens): the points of v(n) the
# report shows; auto itself profiles its own curve as it starts.
AUTO_PROFILED_KS = (1, 3, 7, 15)


def readable(tokens: Sequence[int], model: Model) -> list[int]:
    """Target ids a draft of a smaller (or another) vocabulary can decode, for timing: 0 past its last id."""
    return [token if token < model.n_vocab else 0 for token in tokens]


class CostProfiler:
    """Times the target's 1-token decode and (K+1)-token verify and the draft's 1-token decode (when a
    draft model is loaded), at the same cache position (the first prompt's). `sample()` takes one of
    each, sizes interleaved; it is called after every round, so the profile spans the whole run and
    drift hits it like the runs."""

    def __init__(self, target: Model, draft: Model | None, prompt_tokens: Sequence[int], ks: Iterable[int]) -> None:
        self.target, self.draft = target, draft
        self.models = [target] + ([draft] if draft is not None else [])
        self.context = list(prompt_tokens[:-1]) or list(prompt_tokens)
        # Only widths the context holds after the prompt: every fixed K does (run_bench checks that
        # first), but auto's points need not, beside a long prompt in a small --ctx.
        self.ks = sorted(k for k in set(ks) if len(self.context) + k + 1 <= target.n_ctx)
        self.filler = list(prompt_tokens) * (max(self.ks, default=0) // max(len(prompt_tokens), 1) + 2)
        self.sizes = {"target": 1, **{f"verify{k}": k + 1 for k in self.ks}}
        if draft is not None:
            self.sizes["draft"] = 1
        self.timings: dict[str, list[float]] = {name: [] for name in self.sizes}

    def sample(self, reps: int = 1) -> None:
        for model in self.models:
            model.reset()
            model.decode(readable(self.context, model), n_logit_rows=0)
        for _ in range(reps):
            for name, size in self.sizes.items():
                model = self.draft if name == "draft" else self.target
                self.timings[name].append(model.time_decode(readable(self.filler[:size], model), n_logit_rows=size))
        for model in self.models:
            model.reset()

    def costs(self) -> Costs:
        median = {name: statistics.median(values) for name, values in self.timings.items()}
        target_1 = median["target"]
        draft_1 = median.get("draft")
        return Costs(
            position=len(self.context),
            reps=len(self.timings["target"]),
            target_decode_1_seconds=target_1,
            draft_decode_1_seconds=draft_1,
            c=draft_1 / target_1 if draft_1 is not None else 0.0,
            verify=[
                VerifyCost(k=k, tokens=k + 1, seconds=median[f"verify{k}"], relative_to_1_token=median[f"verify{k}"] / target_1)
                for k in self.ks
            ],
        )


@dataclass
class Measured:
    """What measuring produces; the report adds what was measured, where and how."""

    costs: Costs
    results: list[ConfigResult]
    best: Best | None
    cannot_pay: str | None
    greedy_check: GreedyCheck
    measurements: list[Measurement]
    stopped: str | None = None  # where an interrupt ended the run early: how far it got


Progress = Callable[[str], None]  # advance by one generation, describing the next


def profiled_ks(settings: BenchSettings) -> list[int]:
    """The verify widths to profile: every fixed K asked for, and v(n)'s usual points if auto is."""
    fixed = {k for k in settings.ks if k != AUTO_K}
    return sorted(fixed | (set(AUTO_PROFILED_KS) if AUTO_K in settings.ks else set()))


def run_bench(
    target: Model, draft: Model | None, prompt_set: PromptSet, settings: BenchSettings, progress: Progress | None = None
) -> Measured:
    """Measure every round, profile the costs, check greedy outputs, and summarize each configuration."""
    advance = progress or (lambda _description: None)
    configurations = settings.configurations
    for configuration in configurations:
        require_draft_model(configuration.spec, draft)
    tokenized = [target.tokenizer.tokenize(p.prompt) for p in prompt_set.prompts]
    limit = shared_context(target, draft)
    longest = max(len(t) for t in tokenized)
    # A fixed K needs room for K drafts; auto drafts only into the room there is.
    widest = max([k for k in settings.ks if k != AUTO_K], default=0)
    if longest + settings.n_predict + widest + 1 > limit:
        drafts = f" + K {widest}" if widest else ""
        raise SpeccliError(
            f"the longest prompt ({longest} tokens) + --n-predict {settings.n_predict}{drafts} "
            f"does not fit the context of {limit} tokens; raise --ctx or lower --n-predict"
        )
    check = GreedyChecker(applies=settings.greedy)
    policies = {configuration: make_policy(configuration.k) for configuration in configurations}

    def run_round(index: int, run: int, seed: int, reverse: bool) -> Round:
        task = prompt_set.prompts[index].task
        labels = {"task": task, "prompt_index": index, "run": run, "seed": seed}
        order: list[Configuration | None] = [None, *configurations]  # None: the target alone
        if reverse:
            order.reverse()
        done: dict[Configuration | None, Generation] = {}
        for configuration in order:
            advance(f"{task} · {'target only' if configuration is None else configuration.label}")
            if configuration is None:
                generator = Generator(target, None, settings.sampling, seed=seed)
                sides = {"mode": "target", "spec": None, "k": 0}
            else:
                drafter = make_drafter(configuration.spec, draft, target)
                generator = Generator(target, drafter, settings.sampling, policies[configuration], seed)
                sides = {"mode": "speculative", "spec": configuration.spec, "k": configuration.k}
            done[configuration] = measure_generation(generator, tokenized[index], settings.n_predict, **sides, **labels)
        baseline = done.pop(None)
        if settings.greedy and run >= 0:
            for generation in done.values():
                check.check(
                    target, tokenized[index], baseline.measurement, baseline.tokens, generation.measurement, generation.tokens
                )
        return Round(task, index, run, baseline.measurement, {c: g.measurement for c, g in done.items()})

    profiler = CostProfiler(target, draft, tokenized[0], profiled_ks(settings))
    for warm in range(settings.warmup):
        run_round(0, -1 - warm, settings.seed, reverse=bool(warm % 2))
    advance("profiling decode costs")
    profiler.sample(reps=2)  # and one more after every round

    rounds: list[Round] = []
    planned = settings.runs * len(prompt_set.prompts)
    stopped = None
    try:
        for run in range(settings.runs):
            for index in range(len(prompt_set.prompts)):
                rounds.append(run_round(index, run, settings.seed + run, reverse=bool(len(rounds) % 2)))
                profiler.sample()
    except KeyboardInterrupt:
        if not rounds:
            raise
        # The rounds finished are a measurement of their own, and may have taken an hour: report them.
        stopped = (
            f"stopped by {'SIGTERM' if terminated() else 'Ctrl-C'} after {len(rounds)} of {planned} rounds: "
            "every figure is from those"
        )
    costs = profiler.costs()
    measured_tasks = [task for task in prompt_set.tasks if any(r.task == task for r in rounds)]

    results = [
        ConfigResult(
            spec=configuration.spec,
            k=configuration.k,
            label=configuration.label,
            overall=summarize(rounds, configuration, costs),
            tasks=[
                TaskSummary(task=task, **dict(summarize([r for r in rounds if r.task == task], configuration, costs)))
                for task in measured_tasks
            ],
        )
        for configuration in configurations
    ]
    return Measured(
        costs=costs,
        results=results,
        best=best_configuration(results),
        cannot_pay=cannot_pay(results, costs),
        greedy_check=check.result(),
        measurements=[m for r in rounds for m in (r.baseline, *r.speculative.values())],
        stopped=stopped,
    )
