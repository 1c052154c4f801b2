"""The cannot-pay line of `speccli bench`: from a real tiny-pair report, changed where a test needs the
measurements to say speculation did not pay (every configuration below 1x, or auto drafting nothing),
the report says so in one line naming c and v(n), and that it cannot pay only where those costs rule it
out at the acceptance measured; where a configuration gains, it says nothing."""
from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from speccli.bench.render import render_report
from speccli.bench.theory import best_configuration
from speccli.bench.report import BenchReport, Spread
from speccli.bench.verdict import cannot_pay
from speccli.cli.app import app
from tests.tiny_gguf import TinyConfig, write_related_pair


@pytest.fixture(scope="module")
def mixed_report(tmp_path_factory) -> BenchReport:
    """A real `--spec model,ngram --k auto,2` report of the tiny related pair, on two short prompts."""
    folder = tmp_path_factory.mktemp("verdict")
    target, draft = write_related_pair(folder, target_layers=8, draft_layers=2, eps=0.05, config=TinyConfig())
    prompts = folder / "prompts.txt"
    prompts.write_text("The cat sat on the mat. The cat sat on\nOnce upon a time\n")
    out = folder / "report.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECCLI_CACHE_DIR", str(folder / "cache"))
        result = CliRunner().invoke(app, [
            "bench", "--target", str(target), "--draft", str(draft), "--spec", "model,ngram", "--k", "auto,2",
            "--prompts", str(prompts), "--n-predict", "8", "--runs", "1", "--warmup", "0", "--ctx", "256", "--threads", "1",
            "--json", str(out),
        ])
    assert result.exit_code == 0, result.output
    return BenchReport.model_validate_json(out.read_text())


def with_speedups(report: BenchReport, median: float) -> BenchReport:
    changed = report.model_copy(deep=True)
    for result in changed.results:
        result.overall.speedup = Spread(median=median, min=median - 0.05, max=median + 0.05)
    return changed


def rendered(report: BenchReport) -> str:
    stream = io.StringIO()
    render_report(report, Console(file=stream, width=100, highlight=False, color_system=None))
    return stream.getvalue()


def priced_out(report: BenchReport) -> BenchReport:
    """The report with a draft token as dear as a target step and verifying n tokens n steps: at any
    acceptance, no K beats the target alone, even for a lookup, whose tokens cost nothing to draft."""
    report.costs.c = 1.0
    for verify in report.costs.verify:
        verify.relative_to_1_token = float(verify.tokens)
    return report


def affordable(report: BenchReport) -> BenchReport:
    """The report with verifying n tokens nearly as cheap as one decode: the lookup's drafts pay at any
    acceptance the run measured. (The tiny pair's own curve is steep, and where `auto` drafted little,
    its measured acceptance may be too low for them to pay: the verdict would then rightly differ.)"""
    for verify in report.costs.verify:
        verify.relative_to_1_token = 1.0 + 0.01 * verify.k
    return report


def test_every_configuration_below_one_at_costs_that_rule_it_out_says_it_cannot_pay(mixed_report) -> None:
    slower = priced_out(with_speedups(mixed_report, 0.8))
    line = cannot_pay(slower.results, slower.costs)
    assert line is not None and "\n" not in line
    assert line.startswith("on this machine the draft model costs c = 1.00 of a target step")
    assert "verifying n tokens costs v(n) ≈ " in line and "2.00 (n=2)" in line and "(n=16)" in line
    assert "speculation cannot pay here at the acceptance measured; every configuration is slower than the target alone (best: " in line
    slower.cannot_pay = line
    assert line in rendered(slower).splitlines()  # one line, never wrapped


def test_a_lookup_that_could_pay_where_the_draft_model_cannot_keeps_the_claim_back(mixed_report) -> None:
    """c = 2: no model draft pays at any acceptance, but the lookup's drafts cost nothing, and a curve
    this flat lets them pay: the report has both, so it cannot say speculation cannot pay."""
    slower = with_speedups(mixed_report, 0.8)
    slower.costs.c = 2.0
    for verify in slower.costs.verify:
        verify.relative_to_1_token = 1.0 + 0.01 * verify.k
    assert "cannot pay here" not in cannot_pay(slower.results, slower.costs)
    slower.results = [r for r in slower.results if r.spec == "model"]
    assert "speculation cannot pay here at the acceptance measured" in cannot_pay(slower.results, slower.costs)


def test_slower_where_the_costs_allow_a_gain_is_said_without_claiming_it_cannot_pay(mixed_report) -> None:
    """A short or unlucky run slower than the target alone (`-n 1`, prompts the lookup finds nothing in)
    proves nothing where drafting at the acceptance measured would pay at these costs."""
    slower = affordable(with_speedups(mixed_report, 0.8))
    line = cannot_pay(slower.results, slower.costs)
    assert line is not None and "cannot pay here" not in line
    assert "every configuration is slower than the target alone (best: " in line
    assert line.endswith("; yet at these costs and the acceptance measured some K would gain, so this run is no verdict on "
                         "speculation here")


def test_auto_drafting_nothing_says_so_and_cannot_pay_only_where_the_costs_rule_it_out(mixed_report) -> None:
    idle = affordable(with_speedups(mixed_report, 1.01))
    idle.results = [r for r in idle.results if r.k == "auto"]
    for result in idle.results:
        result.overall.drafted = 0
    line = cannot_pay(idle.results, idle.costs)
    assert line is not None and line.startswith("on this machine the draft model costs c = ")
    assert "cannot pay" not in line and "model auto and ngram auto drafted nothing: it decoded with the target alone" in line
    line = cannot_pay(priced_out(idle).results, idle.costs)
    assert line.endswith("speculation cannot pay here at the acceptance measured; model auto and ngram auto drafted nothing: "
                         "it decoded with the target alone")


def test_auto_drafting_nothing_while_a_fixed_k_gains_claims_neither(mixed_report) -> None:
    idle = with_speedups(mixed_report, 1.2)
    for result in idle.results:
        if result.k == "auto":
            result.overall.drafted = 0
    line = cannot_pay(idle.results, idle.costs)
    assert line is not None and "cannot pay here" not in line
    assert "model auto and ngram auto judged that drafting does not pay and decoded with the target alone, though " in line
    assert line.endswith("K=2 measured 1.20×")


def test_no_line_where_a_configuration_gains(mixed_report) -> None:
    faster = with_speedups(mixed_report, 1.2)
    for result in faster.results:
        result.overall.drafted = max(result.overall.drafted, 1)
    assert cannot_pay(faster.results, faster.costs) is None
    faster.cannot_pay = None
    assert "cannot pay" not in rendered(faster)


def test_without_a_draft_model_the_cost_is_named_as_none(mixed_report) -> None:
    slower = with_speedups(mixed_report, 0.8)
    slower.costs.draft_decode_1_seconds = None
    slower.costs.c = 0.0
    line = cannot_pay(slower.results, slower.costs)
    assert line.startswith("on this machine n-gram lookup costs no model step (c = 0) and verifying n tokens costs")


def test_the_report_shows_k_chosen_and_prediction_not_applicable(mixed_report) -> None:
    text = rendered(mixed_report)
    auto = next(r for r in mixed_report.results if r.label == "model auto")
    assert auto.overall.prediction_not_applicable.startswith("auto: K varies per step")
    ngram = next(r for r in mixed_report.results if r.label == "ngram K=2")
    assert ngram.overall.prediction_not_applicable.startswith("ngram: lookup drafts cost no model step")
    assert "pred. n/a" in text and "fastest" in text


def test_the_task_table_shows_the_target_alones_own_spread_between_runs_of_each_prompt(mixed_report) -> None:
    """The noise a task's speedups carry: half the range of the target alone's tok/s over the runs of
    each of its prompts, relative to their median (the median over the task's prompts); none from one
    run of each, and never a spread between different prompts (this task has two)."""

    def task_row(report: BenchReport) -> str:
        return next(line for line in rendered(report).splitlines() if line.startswith("│ text "))

    assert task_row(mixed_report).endswith("– │")
    noisy = mixed_report.model_copy(deep=True)
    speeds = {0: (18.0, 20.0, 22.0), 1: (9.9, 10.0, 10.2)}  # ±10% and ±1.5%
    targets = [m for m in noisy.measurements if m.mode == "target"]
    assert sorted(m.prompt_index for m in targets) == [0, 1]
    noisy.measurements = [m for m in noisy.measurements if m.mode != "target"] + [
        m.model_copy(update={"run": run, "decode_wall_seconds": m.stats.generated / speed})
        for m in targets for run, speed in enumerate(speeds[m.prompt_index])
    ]
    assert sorted(round(m.wall_tokens_per_second, 1) for m in noisy.measurements if m.mode == "target") == [9.9, 10, 10.2, 18, 20, 22]
    assert task_row(noisy).endswith("±6% │")


def test_the_best_configuration_is_not_called_a_gain_when_every_one_is_slower(mixed_report) -> None:
    slower = best_configuration(with_speedups(mixed_report, 0.8).results)
    assert slower.reason.startswith(f"none is faster than the target alone; {slower.label} comes closest: 0.80x measured")
    faster = best_configuration(with_speedups(mixed_report, 1.2).results)
    assert faster.reason.startswith(f"{faster.label} has the highest measured speedup: 1.20x measured")
    # Every one at 1.2x: the ranges overlap, said of the best by name (after "next is X", "its range
    # overlaps that of X" had read as X's own).
    assert f"; {faster.label}'s min-max range overlaps that of " in faster.reason
