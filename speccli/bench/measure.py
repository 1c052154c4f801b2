"""Measuring: timed generations from empty caches, interleaved rounds (target alone and every
configuration), the decode-cost profiler, and the run that ties them to the summaries, theory, the
cannot-pay verdict and the greedy check.

For each prompt and run, one *round* generates with the target alone (A) and speculatively with every
configuration asked for (B_i: a draft source and K, auto included), through the same backend, sampler
and settings, with the same prompt, max tokens and seed. Rounds alternate their order
(A B1 B2 .. | .. B2 B1 A | A B1 ..) so machine drift hits every side alike. Every generation starts
from empty KV caches and a fresh drafter (a new `Generator`), so no side gets a cached-prompt
shortcut. Each configuration keeps one K policy for the whole bench, as one chat session or server
does: `auto` starts from the pair's one cost profile (`CostProfiler`, measured before the warm-up, and
the report's costs too), and what it learns of acceptance and costs carries from one prompt to the
next; the warm-up rounds are where it starts. `--warmup` unmeasured rounds absorb first-run effects
(page-in, graph allocation).
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
from speccli.core.constraint import Grammar
from speccli.core.generator import GenerationLimits, Generator, PairCosts, measure_costs
from speccli.core.sampling import SamplingParams
from speccli.core.seam import CostProfile, DraftCosts
from speccli.core.stats import DoneEvent, TokenEvent
from speccli.drafting.policy import PROFILED_SIZES
from speccli.drafting.specs import make_drafter, make_policy
from speccli.errors import SpeccliError
from speccli.llama.model import Model, shared_context
from speccli.util.interrupts import terminated
from speccli.drafting.registry import require_draft_model
from speccli.validation import AUTO_K


@dataclass
class Generation:
    measurement: Measurement
    tokens: list[int]  # the generated tokens, with the end-of-generation token if that ended it


def measure_generation(generator: Generator, prompt_tokens: Sequence[int], n_predict: int, grammar: Grammar | None = None,
                       **labels) -> Generation:
    """Generate from empty caches (under `grammar`, where given), timing the whole decode phase by the wall
    clock; labels: task, prompt_index, run, seed, mode, spec, k."""
    generator.reset()
    tokens: list[int] = []
    done: DoneEvent | None = None
    started = time.perf_counter()
    for event in generator.generate(prompt_tokens, GenerationLimits(max_tokens=n_predict, grammar=grammar)):
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


def readable(tokens: Sequence[int], model: Model) -> list[int]:
    """Target ids a draft of a smaller (or another) vocabulary can decode, for timing: 0 past its last id."""
    return [token if token < model.n_vocab else 0 for token in tokens]


class CostProfiler:
    """The pair's one cost profile (`measure_costs`), sampled at the first prompt's cache position: twice
    before the warm-up (`auto` is calibrated from those), then once after every round, so that the
    report's medians span the whole run and drift hits them as it hits the runs."""

    def __init__(self, target: Model, draft: Model | None, prompt_tokens: Sequence[int], sizes: Iterable[int],
                 sampling: SamplingParams) -> None:
        self.target, self.sampling = target, sampling
        self.models = [target] + ([draft] if draft is not None else [])
        self.held = list(prompt_tokens[:-1]) or list(prompt_tokens)  # what the caches hold while timed
        self.sizes = sorted(set(sizes))
        self.drafter = make_drafter("model", draft, target) if draft is not None else None
        self.samples: list[CostProfile] = []

    def sample(self, reps: int = 1) -> None:
        for model in self.models:
            model.reset()
            model.decode(readable(self.held, model), n_logit_rows=0)
        for _ in range(reps):
            self.samples.append(measure_costs(self.target, self.drafter, self.held + [self.held[-1]], self.sizes, self.sampling))
        for model in self.models:
            model.reset()

    def profile(self, sizes: Iterable[int] | None = None) -> CostProfile:
        """Each cost's median over the samples so far, at `sizes` (default: all) where timed."""
        first = self.samples[0]
        timed = [n for n in first.decode_seconds if sizes is None or n in sizes]
        decode = {n: statistics.median(s.decode_seconds[n] for s in self.samples) for n in timed}
        drafts = {
            key: DraftCosts(
                statistics.median(s.draft_costs[key].token_seconds for s in self.samples),
                {n: statistics.median(s.draft_costs[key].catch_up_seconds[n] for s in self.samples) for n in costs.catch_up_seconds},
            )
            for key, costs in first.draft_costs.items()
        }
        return CostProfile(decode, drafts, statistics.median(s.sample_seconds for s in self.samples))

    def costs(self) -> Costs:
        """The report's part: the profile in a target 1-token decode's units."""
        profile = self.profile()
        target_1 = profile.decode_seconds[1]
        draft = profile.draft_costs.get("model")
        draft_1 = draft.token_seconds if draft is not None else None
        return Costs(
            position=len(self.held),
            reps=len(self.samples),
            target_decode_1_seconds=target_1,
            draft_decode_1_seconds=draft_1,
            c=draft_1 / target_1 if draft_1 is not None else 0.0,
            verify=[
                VerifyCost(k=n - 1, tokens=n, seconds=seconds, relative_to_1_token=seconds / target_1)
                for n, seconds in sorted(profile.decode_seconds.items()) if n > 1
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


def profiled_sizes(settings: BenchSettings) -> list[int]:
    """The verify sizes (logit rows) to profile: K + 1 for every fixed K asked for, and auto's if it is."""
    fixed = {k + 1 for k in settings.ks if k != AUTO_K}
    return sorted(fixed | (set(PROFILED_SIZES) if AUTO_K in settings.ks else set()))


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
    grammar = None if settings.grammar is None else Grammar(settings.grammar, target.tokenizer.grammar_vocabulary(), target.n_vocab)
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
                generator = Generator(target, drafter, settings.sampling, policies[configuration], seed, PairCosts(target, drafter, auto_costs))
                sides = {"mode": "speculative", "spec": configuration.spec, "k": configuration.k}
            done[configuration] = measure_generation(generator, tokenized[index], settings.n_predict, grammar, **sides, **labels)
        baseline = done.pop(None)
        if not baseline.measurement.stats.generated:  # no tokens: tokens per second, and every ratio to them, undefined
            allows = " (--json-schema or --grammar lets a reply end there)" if grammar is not None else ""
            raise SpeccliError(f"the target alone ended its reply to the {task!r} prompt at once{allows}: "
                               "there is nothing to time")
        if settings.greedy and run >= 0:
            for generation in done.values():
                check.check(
                    target, tokenized[index], baseline.measurement, baseline.tokens, generation.measurement, generation.tokens
                )
        return Round(task, index, run, baseline.measurement, {c: g.measurement for c, g in done.items()})

    profiler = CostProfiler(target, draft, tokenized[0], profiled_sizes(settings), settings.sampling)
    advance("profiling decode costs")
    profiler.sample(reps=2)  # and one more after every round
    # auto's own sizes only: its curve must not depend on which fixed K the run also measures.
    auto_costs = profiler.profile((1, *PROFILED_SIZES))
    for warm in range(settings.warmup):
        run_round(0, -1 - warm, settings.seed, reverse=bool(warm % 2))

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
