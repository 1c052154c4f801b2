"""`speccli bench`: check the input, load the pair, measure with a progress bar, write the JSON report
first, then show it. See `measure` for how a measurement is made, `summary` and `theory` for the
figures and formulas, `verdict` for the cannot-pay line, `greedy` for the honesty check, `report` for
the JSON's types and schema.

A configuration is a draft source (`--spec`: model, ngram, ngram+model) and a K (`--k`: a number, or
auto, chosen per step); bench measures every combination of the lists given against one target-only
baseline per round.

Figures and formulas
--------------------
* acceptance rate         = accepted / drafted (draft tokens kept / draft tokens proposed)
* per-position acceptance = accepted_at[i] / drafted_at[i]: of the steps that drafted token i+1, the
                            share where it was kept (it is only kept if tokens 1..i were)
* alpha (estimate)        = accepted / judged (RunStats' PositionCounts.judged: a step judges its
                            accepted drafts plus the one it rejected, if any)
* tokens per target decode = generated / steps: COUNTS the target's own correction/bonus token
* c, v(K+1)               = draft 1-token decode / target 1-token decode, and (K+1)-token verify /
                            target 1-token decode, profiled with Model.decode at the first prompt's
                            position (medians over the whole run); the same ratios from the runs' own
                            per-step timers are reported beside them as "in-run costs" (c over the
                            steps that drafted: the others only asked the sources)
* E(alpha, K) = (1 - alpha^(K+1)) / (1 - alpha), S_pred(K) = E / (K*c + v(K+1))  (Leviathan et al. 2023),
                            for a fixed K with a model draft only (n/a for auto and n-gram sources)
* K chosen                = RunStats.draft_lengths: target decodes by tokens drafted before them, 0 included
* tokens/s and speedup    = wall-clock over the decode phase (prefill timed apart); the time split
                            is the engine's per-step timers, plus what lies between steps
"""
from __future__ import annotations

from datetime import datetime, timezone

from rich.console import Console

from speccli.bench.environment import environment, model_file
from speccli.bench.files import json_destination, refuse_overwriting, write_report
from speccli.bench.greedy import raise_if_failed
from speccli.bench.measure import Measured, run_bench
from speccli.bench.prompts import PromptSet, load_prompt_set
from speccli.bench.render import render_report
from speccli.bench.report import KIND, NOTES, SCHEMA_VERSION, BenchReport, Environment, Models, PromptsInfo, Settings
from speccli.bench.settings import BenchRequest, BenchSettings
from speccli.vocab.check import draft_proposes
from speccli.errors import SpeccliError
from speccli.llama.model import naming_non_finite_logits
from speccli.models.pair import open_pair
from speccli.util.cache import user_config_path
from speccli.util.progress import progress_bar


def console(stderr: bool = False) -> Console:
    """Where the human-readable report goes; a non-terminal stdout gets room for the wide tables."""
    out = Console(stderr=stderr, highlight=False)
    if not out.is_terminal:
        out = Console(stderr=stderr, highlight=False, width=max(out.width, 132))
    return out


def build_report(
    *, command: str, settings: BenchSettings, n_ctx: int, env: Environment, models: Models, prompt_set: PromptSet,
    measured: Measured,
) -> BenchReport:
    return BenchReport(
        schema_version=SCHEMA_VERSION,
        kind=KIND,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=command,
        settings=Settings(
            spec=list(settings.specs), k=list(settings.ks), n_predict=settings.n_predict,
            temperature=settings.temperature, top_k=settings.sampling.top_k, top_p=settings.sampling.top_p,
            min_p=settings.sampling.min_p, greedy=settings.greedy, seed=settings.seed, runs=settings.runs,
            warmup=settings.warmup, n_ctx=n_ctx,
        ),
        environment=env,
        models=models,
        prompts=PromptsInfo(
            source=prompt_set.source, sha256=prompt_set.sha256, count=len(prompt_set.prompts), tasks=prompt_set.tasks
        ),
        notes=NOTES,
        costs=measured.costs,
        results=measured.results,
        best=measured.best,
        cannot_pay=measured.cannot_pay,
        greedy_check=measured.greedy_check,
        measurements=measured.measurements,
        stopped=measured.stopped,
    )


def run_command(request: BenchRequest) -> None:
    """Validate everything cheap first (nothing is loaded or written on bad input), then measure."""
    request.settings.validate()
    pair_request = request.loading_request()
    pair_request.validate()
    prompt_set = load_prompt_set(request.prompts_file, structured=request.settings.grammar is not None)
    destination = json_destination(request.json_path)
    refuse_overwriting(destination, [("prompts file", request.prompts_file), ("user models.toml", user_config_path()),
                                     *(("--config file", path) for path in pair_request.config)])
    # With the JSON on stdout, the human-readable report moves to stderr.
    out = console(stderr=destination is not None and destination.is_stdout)

    with open_pair(pair_request) as loaded:
        resolved = loaded.resolved
        refuse_overwriting(destination, [("target model", resolved.target_path), ("draft model", resolved.draft_path)])
        n_ctx = loaded.target.n_ctx  # what llama.cpp holds: it rounds a --ctx up (100 to 256)
        settings = request.resolved(resolved.spec, resolved.k)
        with naming_non_finite_logits(loaded.target, loaded.draft):
            measured = _measure_with_progress(loaded.target, loaded.draft, prompt_set, settings)
        report = build_report(
            command=request.reproducing_command(settings, n_ctx),
            settings=settings,
            n_ctx=n_ctx,
            env=environment(request.pair.n_threads, loaded.target, loaded.draft),
            models=Models(
                pair=resolved.name,
                target=model_file(resolved.target_name, resolved.target_path),
                draft=model_file(resolved.draft_name, resolved.draft_path) if resolved.draft_path is not None else None,
                draft_proposes=draft_proposes(resolved.draft_path, resolved.target_path),
            ),
            prompt_set=prompt_set,
            measured=measured,
        )
    # The file first: a reader that goes away early (`| head`, quitting a pager) must not cost it. A file
    # that cannot be written (the disk full after a long run) is kept elsewhere and named after the report.
    unwritten = None
    if destination is not None:
        try:
            write_report(destination, report)
        except SpeccliError as error:
            unwritten = error
    render_report(report, out)
    if unwritten is not None:
        raise unwritten
    if destination is not None and not destination.is_stdout:
        out.print(f"  wrote {destination.given}")
    raise_if_failed(report.greedy_check)
    if report.stopped:
        raise KeyboardInterrupt  # reported; the exit code still says the run was stopped (130, 143)


def _measure_with_progress(target, draft, prompt_set: PromptSet, settings: BenchSettings) -> Measured:
    per_round = 1 + len(settings.configurations)
    total = (settings.warmup + settings.runs * len(prompt_set.prompts)) * per_round + 1
    with progress_bar(console(stderr=True)) as bar:
        task_id = bar.add_task("warming up", total=total)
        started = False

        def advance(description: str) -> None:
            nonlocal started
            if started:
                bar.advance(task_id)
            started = True
            bar.update(task_id, description=description)

        measured = run_bench(target, draft, prompt_set, settings, advance)
        bar.update(task_id, completed=total)
    return measured
