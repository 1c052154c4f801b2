"""`speccli bench` on tiny real GGUF models, driven through the real CLI: every figure is produced, the
JSON report validates against the schema generated from the report's types, draft sources and auto K
are compared side by side, `--spec ngram` needs no draft model, the greedy check catches a diverging
engine, and bad input fails with one line before anything is loaded or written."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from typer.testing import CliRunner

import speccli.bench.command as bench_command
import speccli.bench.measure as measure
import speccli.models.pair as pair_module
from speccli.bench.prompts import load_prompt_set
from speccli.bench.render import _split_text, by_source_text
from speccli.bench.report import Costs, Measurement, Summary, report_schema
from speccli.bench.settings import BenchRequest, BenchSettings, Configuration
from speccli.bench.summary import Round, _by_source, _time_split, summarize
from speccli.bench.theory import estimate_alpha, expected_tokens_per_verify, predicted_speedup
from speccli.cli.app import app
from speccli.core.generator import PROFILE_TIMINGS
from speccli.drafting.policy import AutoK
from speccli.core.stats import RunStats, StepEvent
from speccli.core.verify import DraftVerdict, verify_greedy
from speccli.llama.tokenizer import load_vocab_only
from speccli.models.pair import PairRequest
from speccli.validation import AUTO_K, K
from tests.conftest import widest_verify_timings
from tests.tiny_gguf import TinyConfig, write_related_pair

# The built-in prompts run to ~900 tokens of the tiny byte-level vocabulary: a 2048-token context holds them.
REPO = Path(__file__).resolve().parents[1]
FAST = ["--n-predict", "12", "--runs", "1", "--warmup", "0", "--ctx", "2048", "--threads", "1"]
BUILTIN_TASKS = ["code", "json", "summarize", "story", "qa", "rewrite", "quote", "table"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Keep the sha256 cache (and anything else cached) out of the user's home."""
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def schema() -> dict:
    document = report_schema()
    jsonschema.Draft202012Validator.check_schema(document)
    return document


@pytest.fixture(scope="module")
def bench_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The conftest's related tiny pair (8-layer target, its first 2 layers as draft, eps 0.05), trained
    context 2048 so the built-in prompts fit."""
    return write_related_pair(
        tmp_path_factory.mktemp("pair"), target_layers=8, draft_layers=2, eps=0.05, config=TinyConfig(context_length=2048)
    )


@pytest.fixture
def pair_args(bench_pair) -> list[str]:
    return ["--target", str(bench_pair[0]), "--draft", str(bench_pair[1])]


def invoke(*args: str):
    return CliRunner().invoke(app, ["bench", *args])


def validate(report: dict, schema: dict) -> None:
    jsonschema.validate(report, schema, cls=jsonschema.Draft202012Validator)


def assert_complete(summary: dict, k: int) -> None:
    """Every figure of one K is there and has a value (the tiny pair drafts and accepts tokens)."""
    for side in ("baseline", "speculative"):
        assert summary[side]["wall_tokens_per_second"]["median"] > 0
        assert summary[side]["prefill_seconds"] is not None
        assert summary[side]["tokens"] > 0
        split = summary[side]["time_split"]
        parts = ("draft", "target", "other", "between_steps")
        assert sum(split[f"{n}_fraction"] for n in parts) == pytest.approx(1, abs=1e-6)
    assert summary["speedup"]["min"] <= summary["speedup"]["median"] <= summary["speedup"]["max"]
    assert 0 < summary["acceptance_rate"] <= 1
    assert 0 < summary["alpha"] <= 1
    assert summary["accepted"] <= summary["judged"] <= summary["drafted"]
    assert summary["alpha"] == pytest.approx(summary["accepted"] / summary["judged"])
    assert len(summary["per_position_acceptance"]) == k
    assert 1 <= summary["tokens_per_target_decode"] <= k + 1
    # the last step may be cut short by --n-predict, so at most (not exactly) one more than the drafts kept
    assert summary["tokens_per_target_decode"] <= summary["accepted_per_target_decode"] + 1 + 1e-9
    assert summary["predicted"]["speedup"] > 0
    assert summary["predicted"]["tokens_per_verify"] == pytest.approx(
        expected_tokens_per_verify(summary["alpha"], k)
    )
    assert summary["efficiency"] == pytest.approx(summary["speedup"]["median"] / summary["predicted"]["speedup"])
    assert summary["observed_costs"]["c"] > 0


# --- end to end -----------------------------------------------------------------------------------


def test_single_k_reports_every_figure_and_valid_json(pair_args, tmp_path, schema) -> None:
    out = tmp_path / "report.json"
    result = invoke(*pair_args, "--spec", "model", "--k", "3", *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    for text in ("model, K = 3", "overall", "K chosen", "acceptance by source", "speedup", "per-position acceptance", "decode time, speculative",
                 "c = ", "greedy check", "predicted", "efficiency"):
        assert text in result.stdout, text
    report = json.loads(out.read_text())
    validate(report, schema)
    assert [(r["spec"], r["k"], r["label"]) for r in report["results"]] == [("model", 3, "model K=3")]
    assert report["command"].startswith("speccli bench --target ")
    assert "--spec model --k 3 --n-predict 12 --temp 0 --top-k 0 --top-p 1 --min-p 0" in report["command"]
    assert report["best"] is None and report["schema_version"] == 7
    result_k = report["results"][0]
    assert_complete(result_k["overall"], 3)
    assert [t["task"] for t in result_k["tasks"]] == report["prompts"]["tasks"] == BUILTIN_TASKS
    assert report["prompts"]["source"] == "built-in" and report["prompts"]["count"] == 8
    assert report["costs"]["c"] > 0 and report["costs"]["verify"][0]["tokens"] == 4
    assert report["greedy_check"]["checked"] == 8 and report["greedy_check"]["status"] in ("passed", "near_tie")
    # one target-only and one speculative generation per prompt and run, each with its own token count
    modes = [m["mode"] for m in report["measurements"]]
    assert modes.count("target") == modes.count("speculative") == 8
    env = report["environment"]
    assert env["threads"] == 1 and env["backend"] and env["llama_cpp_python"]
    for role in ("target", "draft"):
        assert report["models"][role]["size_bytes"] == Path(report["models"][role]["path"]).stat().st_size
    assert not [p for p in tmp_path.iterdir() if p.name != "report.json"], "no temporary files left behind"
    # judged is the engine's count (RunStats.positions.judged), summed over the speculative runs
    spec = [m["stats"]["positions"] for m in report["measurements"] if m["mode"] == "speculative"]
    assert result_k["overall"]["judged"] == sum(p["judged"] for p in spec) > 0
    assert result_k["overall"]["drafted"] == sum(m["stats"]["positions"]["drafted"] for m in report["measurements"])


@pytest.mark.parametrize(("interrupt", "exit_code", "name"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")],
                         ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_reports_the_rounds_it_finished(pair_args, tmp_path, schema, interrupt, exit_code, name) -> None:
    """A real process gets a real signal, sent by itself as its third measured round ends (the signal
    lands as the last generation of that round returns, so the round is under way: two are finished).
    Sent from outside, where it landed depended on the machine's load."""
    out = tmp_path / "stopped.json"
    script = (
        "import os, sys, speccli.bench.measure as measure\n"
        "from speccli.cli.app import main\n"
        "measured, count = measure.measure_generation, [0]\n"
        "def counted(*args, **kwargs):\n"
        "    generation = measured(*args, **kwargs)\n"
        "    count[0] += generation.measurement.run >= 0  # warm-up rounds have run -1\n"
        "    if count[0] == 6:  # three rounds of the target alone and K=2\n"
        f"        os.kill(os.getpid(), {int(interrupt)})\n"
        "    return generation\n"
        "measure.measure_generation = counted\n"
        "sys.argv[0] = 'speccli'\n"
        "main()\n"
    )
    command = [sys.executable, "-c", script, "bench", *pair_args, "--spec", "model", "--k", "2", "-n", "12", "--runs", "50",
               "--warmup", "1", "--ctx", "2048", "--threads", "1", "--json", str(out)]
    result = subprocess.run(command, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, timeout=300)
    assert result.returncode == exit_code, result.stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in result.stderr
    report = json.loads(out.read_text())
    validate(report, schema)
    assert len(report["measurements"]) == 4  # two rounds: the target alone and K=2 each
    assert report["stopped"] == f"stopped by {name} after 2 of 400 rounds: every figure is from those"
    assert report["results"][0]["overall"]["runs"] == 2
    assert [task["task"] for task in report["results"][0]["tasks"]] == BUILTIN_TASKS[:2]
    assert report["stopped"] in " ".join(result.stdout.decode().split())


def test_a_grammar_that_lets_the_target_end_at_once_is_one_line_not_a_report(pair_args, tmp_path) -> None:
    """Every output empty, the report had shown 0/0 tokens beside a 1.62x predicted speedup, 8/8 drafts
    kept and a greedy check passed. The control: a grammar that asks for a token measures."""
    empty = tmp_path / "empty.gbnf"
    empty.write_text('root ::= ""\n')  # a reply may only end at once
    result = invoke(*pair_args, "--spec", "model", "--k", "3", *FAST, "--grammar", str(empty))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines()[-1] == ("error: the target alone ended its reply to the 'extract' prompt at once (--json-schema "
                                              "or --grammar lets a reply end there): there is nothing to time")
    letter = tmp_path / "letter.gbnf"
    letter.write_text('root ::= [a-z]+\n')
    assert invoke(*pair_args, "--spec", "model", "--k", "3", *FAST, "--grammar", str(letter)).exit_code == 0


def test_an_interrupt_in_the_warm_up_has_nothing_to_report(pair_args, tmp_path, monkeypatch) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure, "measure_generation", interrupted)
    out = tmp_path / "report.json"
    result = invoke(*pair_args, "--spec", "model", "--k", "2", *FAST, "--warmup", "1", "--json", str(out))
    assert result.exit_code == 130 and not out.exists()


def test_sweep_reports_each_k_best_and_chart(pair_args, tmp_path, schema) -> None:
    out = tmp_path / "sweep.json"
    result = invoke(*pair_args, "--spec", "model", "--k", "1-2,4", *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "speedup by configuration" in result.stdout and "acceptance rate by configuration" in result.stdout
    assert "best: model K=" in result.stdout
    report = json.loads(out.read_text())
    validate(report, schema)
    assert [r["k"] for r in report["results"]] == [1, 2, 4]
    for result_k in report["results"]:
        assert_complete(result_k["overall"], result_k["k"])
    assert [v["k"] for v in report["costs"]["verify"]] == [1, 2, 4]
    assert report["best"]["label"] in ("model K=1", "model K=2", "model K=4") and report["best"]["reason"]
    # one baseline per round, shared by every K of the round
    modes = [m["mode"] for m in report["measurements"]]
    assert modes.count("target") == 8 and modes.count("speculative") == 24
    assert report["greedy_check"]["checked"] == 24

    compared = CliRunner().invoke(app, ["bench", "--compare", str(out), str(out)])
    assert compared.exit_code == 0, compared.output
    assert "speedup A → B" in compared.stdout and "nothing in models" in compared.stdout
    assert "model K=4" in compared.stdout


def test_spec_list_and_auto_in_one_run(pair_args, tmp_path, schema) -> None:
    """Every (spec, K) against one target-only baseline per round: K chosen, acceptance by source and
    the per-task winner reported for each; the prediction only where it applies (fixed K, model)."""
    out = tmp_path / "mixed.json"
    result = invoke(*pair_args, "--spec", "model,ngram+model", "--k", "2,auto", *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    validate(report, schema)
    assert report["settings"]["spec"] == ["model", "ngram+model"] and report["settings"]["k"] == [None, 2]
    labels = ["model auto", "model K=2", "ngram+model auto", "ngram+model K=2"]
    assert [r["label"] for r in report["results"]] == labels
    for text in (*labels, "speedup by task and configuration", "fastest", "K chosen", "pred. n/a"):
        assert text in result.stdout, text
    for config in report["results"]:
        overall = config["overall"]
        # the K-chosen histogram counts every target decode, and its mean is drafted / decodes
        assert sum(overall["draft_lengths"].values()) == overall["target_decodes"] > 0
        assert overall["mean_draft_length"] == pytest.approx(overall["drafted"] / overall["target_decodes"])
        assert sum(int(length) * steps for length, steps in overall["draft_lengths"].items()) == overall["drafted"]
        # acceptance by source adds up to the whole
        sources = {s["source"]: s for s in overall["by_source"]}
        assert set(sources) <= set(config["spec"].split("+"))
        assert sum(s["drafted"] for s in sources.values()) == overall["drafted"]
        assert sum(s["accepted"] for s in sources.values()) == overall["accepted"]
        if config["label"] == "model K=2":
            assert overall["predicted"] is not None and overall["prediction_not_applicable"] is None
            assert max(map(int, overall["draft_lengths"])) == 2
        else:
            assert overall["predicted"] is None and overall["efficiency"] is None
            assert overall["prediction_not_applicable"]
        assert [t["task"] for t in config["tasks"]] == BUILTIN_TASKS
    assert report["best"]["label"] in labels
    # one baseline per round, four speculative generations beside it, each labelled with its source and K
    speculative = [(m["spec"], m["k"]) for m in report["measurements"] if m["mode"] == "speculative"]
    assert sorted(set(speculative), key=str) == sorted({("model", None), ("model", 2), ("ngram+model", None), ("ngram+model", 2)}, key=str)
    assert len(speculative) == 32 and [m["mode"] for m in report["measurements"]].count("target") == 8
    assert report["greedy_check"]["checked"] == 32 and report["greedy_check"]["status"] in ("passed", "near_tie")
    # v(n) at auto's sizes, n = 2, 4, 8, 16, 25 (the profile auto starts from), beside the fixed K's own width
    assert [v["tokens"] for v in report["costs"]["verify"]] == [2, 3, 4, 8, 16, 25]


def test_ngram_runs_without_any_draft_model(bench_pair, tmp_path, schema, monkeypatch) -> None:
    """`-m TARGET --spec ngram`: no draft model named, none loaded; the profiler has no draft cost."""
    loaded: list[Path] = []

    class RecordingModel(pair_module.Model):
        def __init__(self, path, options, name=None):
            loaded.append(Path(path))
            super().__init__(path, options, name)

    monkeypatch.setattr(pair_module, "Model", RecordingModel)
    out = tmp_path / "ngram.json"
    result = invoke("-m", str(bench_pair[0]), "--spec", "ngram", "--k", "auto,3", *FAST, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert loaded == [bench_pair[0]]
    report = json.loads(out.read_text())
    validate(report, schema)
    assert report["models"]["draft"] is None and report["environment"]["draft_n_gpu_layers"] is None
    assert report["costs"]["draft_decode_1_seconds"] is None and report["costs"]["c"] == 0
    assert [r["label"] for r in report["results"]] == ["ngram auto", "ngram K=3"]
    for config in report["results"]:
        assert {s["source"] for s in config["overall"]["by_source"]} <= {"ngram"}
        assert config["overall"]["prediction_not_applicable"]
    assert "draft  none" in result.stdout and "no draft model → c = 0" in result.stdout
    assert "--spec ngram --k auto,3" in report["command"] and "--draft" not in report["command"]


def test_sampling_filters_apply_to_both_sides(pair_args, tmp_path, schema, monkeypatch) -> None:
    seen = []

    class RecordingGenerator(measure.Generator):
        def __init__(self, target, drafter, sampling, *args, **kwargs):
            seen.append((drafter is not None, sampling))
            super().__init__(target, drafter, sampling, *args, **kwargs)

    monkeypatch.setattr(measure, "Generator", RecordingGenerator)
    out = tmp_path / "filtered.json"
    filters = ["--temp", "0.7", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.05"]
    result = invoke(*pair_args, "--spec", "model", "--k", "2", *FAST, *filters, "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    validate(report, schema)
    settings = report["settings"]
    assert (settings["temperature"], settings["top_k"], settings["top_p"], settings["min_p"]) == (0.7, 20, 0.9, 0.05)
    assert "--temp 0.7 --top-k 20 --top-p 0.9 --min-p 0.05" in report["command"]
    assert "temperature 0.7, seed 42, top-k 20, top-p 0.9, min-p 0.05" in result.stdout
    assert {speculative for speculative, _ in seen} == {True, False}
    assert {(s.temperature, s.top_k, s.top_p, s.min_p) for _, s in seen} == {(0.7, 20, 0.9, 0.05)}


def test_sampling_run_and_plain_text_prompts(pair_args, tmp_path, schema) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The cat sat on\n\nOnce upon a time\\nthere was\n")
    out = tmp_path / "sampled.json"
    result = invoke(*pair_args, "--spec", "model", "--k", "2", *FAST, "--temp", "0.8", "--seed", "7", "--prompts", str(prompts), "--json", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    validate(report, schema)
    assert report["greedy_check"]["status"] == "not_applicable"
    assert report["prompts"]["count"] == 2 and report["prompts"]["tasks"] == ["text"]
    assert {m["seed"] for m in report["measurements"]} == {7}
    assert "equal text is not expected" in result.stdout


def test_greedy_check_catches_a_diverging_engine(pair_args, tmp_path, schema, monkeypatch) -> None:
    def wrong_after_drafts(drafted, target_logits, argmax=None):
        verdict = verify_greedy(drafted, target_logits, argmax)
        if not len(drafted):  # the target alone: untouched
            return verdict
        # emit a token the target did not choose, where it clearly prefers its own
        row = np.asarray(target_logits[verdict.n_accepted])
        return DraftVerdict(verdict.n_accepted, int(row.argmin()))

    monkeypatch.setattr("speccli.core.generator.verify_greedy", wrong_after_drafts)
    out = tmp_path / "broken.json"
    result = invoke(*pair_args, "--spec", "model", "--k", "2", *FAST, "--json", str(out))
    assert result.exit_code == 3, result.output
    assert "PARTING (not a near-tie)" in result.stdout and "greedy check FAILED" in result.stdout
    assert result.stderr.strip().startswith("error: greedy check failed")
    report = json.loads(out.read_text())  # written, with the failure in it
    validate(report, schema)
    check = report["greedy_check"]
    assert check["status"] == "failed"
    assert check["partings"] and all(p["near_tie"] is False for p in check["partings"])
    assert all(p["top_two_gap"] > p["tolerance"] for p in check["partings"])
    # each tolerance was measured at the widest verify batch its run used
    widest = {(m["prompt_index"], m["run"]): max(map(int, m["stats"]["draft_lengths"])) + 1
              for m in report["measurements"] if m["mode"] == "speculative"}
    assert all(p["verify_rows"] == widest[p["prompt_index"], p["run"]] for p in check["partings"])


# --- bad input: one line, non-zero exit, nothing written ---------------------------------------------


def _bad_prompt_files(directory: Path) -> dict[str, Path]:
    files = {
        "empty": directory / "empty.jsonl",
        "blank": directory / "blank.txt",
        "binary": directory / "binary.bin",
        "latin1": directory / "latin1.txt",
        "bad-jsonl": directory / "bad.jsonl",
        "no-prompt": directory / "noprompt.jsonl",
        "text-key": directory / "textkey.jsonl",
        "empty-prompt": directory / "emptyprompt.jsonl",
        "blank-prompt": directory / "blankprompt.jsonl",
        "array-lines": directory / "arrays.jsonl",  # JSON, but not objects: refused, not read as text
    }
    files["empty"].write_bytes(b"")
    files["blank"].write_text("\n  \n\n")
    files["binary"].write_bytes(bytes(range(256)) * 4)
    files["latin1"].write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    files["bad-jsonl"].write_text('{"task": "a", "prompt": "x"}\n{"task": "b", "prompt": \n')
    files["no-prompt"].write_text('{"task": "a"}\n')
    files["text-key"].write_text('{"text": 5}\n')
    files["empty-prompt"].write_text('{"task": "a", "prompt": ""}\n')
    files["blank-prompt"].write_text('{"task": "a", "prompt": "   "}\n')
    files["array-lines"].write_text('["a", "b"]\n')
    return files


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--k", "0"], "between 1 and"),
        (["--k", "1,x"], "not auto, a number or a range"),
        (["--k", "auto,x"], "'x' is not auto, a number or a range"),
        (["--k", "aut"], "'aut' is not auto, a number or a range"),
        (["--spec", "ngrm"], "--spec must be one of ngram, suffix, model, ngram+model, suffix+model, got 'ngrm'"),
        (["--spec", "model,"], "--spec must be one of ngram, suffix, model, ngram+model, suffix+model, got ''"),
        (["--spec", "ngram"], "--spec ngram drafts without a model, but a draft model was given"),
        (["--top-k", "-1"], "--top-k must be >= 0"),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--min-p", "1"], "--min-p must be in [0, 1)"),
        (["--k", "5-2"], "runs backwards"),
        (["--k", "1-0"], "between 1 and 64, got 0"),
        (["--draft", ""], "--draft (-md) is empty; give a registry name or a GGUF path"),
        (["--k", ""], "empty"),
        (["--k", "1-100"], "between 1 and"),
        (["--runs", "0"], "--runs must be >= 1"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--n-predict", "0"], "--n-predict must be >= 1"),
        (["--temp", "-1"], "--temp must be from 0 (greedy) to 2, got -1"),
        (["--temp", "inf"], "--temp must be a finite number, got inf"),
        (["--k", "-1"], "between 1 and 64, got -1"),
        (["--prompts", "MISSING"], "no such file"),
        (["--prompts", "empty"], "no prompts in it"),
        (["--prompts", "blank"], "no prompts in it"),
        (["--prompts", "binary"], "binary data"),
        (["--prompts", "/dev/zero"], "/dev/zero: more than 16 MiB"),  # read no further
        (["--prompts", "latin1"], "not UTF-8 text"),
        (["--prompts", "bad-jsonl"], "line 2: not valid JSON"),
        (["--prompts", "no-prompt"], "line 1: no \"prompt\" key (keys given: 'task')"),
        (["--prompts", "empty-prompt"], '"prompt" must be a string with text in it'),
        (["--prompts", "blank-prompt"], '"prompt" must be a string with text in it'),
        (["--prompts", "array-lines"], 'line 1: expected an object {"task": ..., "prompt": ...}'),
        (["--prompts", "text-key"], "line 1: no \"prompt\" key (keys given: 'text'); a line is {\"task\": ..., \"prompt\": ...}"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(pair_args, tmp_path, args, message, monkeypatch) -> None:
    def no_loading(*_args, **_kwargs):
        raise AssertionError("a model was loaded for bad input")

    monkeypatch.setattr(pair_module, "Model", no_loading)
    files = _bad_prompt_files(tmp_path)
    if args[0] == "--prompts":
        named = Path(args[1]) if args[1].startswith("/") else files.get(args[1], tmp_path / "missing.jsonl")
        args = ["--prompts", str(named)]
    out = tmp_path / "out.json"
    result = invoke(*pair_args, *FAST, *args, "--json", str(out))
    assert result.exit_code != 0
    if message in ("binary data", "not UTF-8 text", "line 2: not valid JSON"):  # a file not what it should be
        assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not out.exists()
    # nothing else either: no partial report (the atomic writer's out.json.PID.partial), no probe file
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in files.values())


def test_a_file_that_cannot_be_read_is_exit_2_as_for_models(pair_args, tmp_path) -> None:
    missing = tmp_path / "missing.json"
    for args, line in (
        ([*pair_args, *FAST, "--prompts", str(missing)], f"error: prompts file {missing}: no such file"),
        ([*pair_args, *FAST, "--prompts", str(tmp_path)], f"error: prompts file {tmp_path}: is a directory"),
        (["--compare", str(missing), str(missing)], f"error: {missing}: no such file"),  # alone: it measures nothing
    ):
        result = invoke(*args)
        assert (result.exit_code, result.stderr) == (2, line + "\n")


def test_json_into_a_missing_folder_fails_before_measuring(pair_args, tmp_path) -> None:
    result = invoke(*pair_args, *FAST, "--json", str(tmp_path / "nowhere" / "out.json"))
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: --json {tmp_path / 'nowhere' / 'out.json'}: the folder {tmp_path / 'nowhere'} does not exist"


def test_json_never_replaces_a_file_the_run_reads(pair_args, bench_pair, tmp_path, monkeypatch) -> None:
    """The prompts file and a --config file are refused before anything loads; a model file (known once
    the pair is resolved) before anything is measured. Each file is left as it was."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"task": "a", "prompt": "one two"}\n')
    config = tmp_path / "models.toml"
    config.write_text("")
    own_config = tmp_path / "xdg" / "speccli" / "models.toml"  # read on every run, as the registry's second file
    own_config.parent.mkdir(parents=True)
    own_config.write_text("# mine\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    draft_copy = tmp_path / "draft.gguf"
    draft_copy.write_bytes(bench_pair[1].read_bytes())
    before = {path: path.read_bytes() for path in (prompts, config, own_config, draft_copy)}
    args = [*FAST, "--target", str(bench_pair[0]), "--draft", str(draft_copy), "--prompts", str(prompts)]

    def no_measuring(*_args, **_kwargs):
        raise AssertionError("measured though --json names an input")

    monkeypatch.setattr(bench_command, "run_bench", no_measuring)
    for given, what in ((prompts, "prompts file"), (config, "--config file"), (own_config, "user models.toml"),
                        (draft_copy, "draft model")):
        result = invoke(*args, "--config", str(config), "--json", str(given))
        assert result.exit_code == 1
        assert result.stderr == f"error: --json {given}: is the {what} this run reads; write the report elsewhere\n"
    assert {path: path.read_bytes() for path in before} == before


@pytest.mark.parametrize("k, drafts", [("auto", ""), ("4", " + K 4")])
def test_a_reply_that_cannot_fit_the_context_is_refused_in_one_line(pair_args, tmp_path, k, drafts) -> None:
    """Only a fixed K reserves room for its drafts (auto drafts into the room there is)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"task": "a", "prompt": "one two"}\n')
    result = invoke(*pair_args, *FAST, "--ctx", "256", "--n-predict", "300", "--k", k, "--prompts", str(prompts))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: the longest prompt (")
    assert result.stderr.endswith(
        f" tokens) + --n-predict 300{drafts} does not fit the context of 256 tokens; raise --ctx or lower --n-predict\n"
    )


def test_the_report_records_the_context_llama_cpp_holds(pair_args, tmp_path) -> None:
    """llama.cpp rounds a context up to a multiple of 256: the report and its command said 100, the
    context asked for, not the one the run had."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"task": "a", "prompt": "one two"}\n')
    result = invoke(*pair_args, *FAST, "--ctx", "100", "--k", "1", "--prompts", str(prompts), "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["n_ctx"] == 256
    assert report["command"].endswith(" --ctx 256 --threads 1")


def test_auto_beside_a_long_prompt_in_a_small_context_profiles_the_widths_that_fit(bench_pair, pair_args, tmp_path) -> None:
    """bench profiles v(n) for auto at n up to 25 after the first prompt: where those rows do
    not fit, they are left out (the run had failed after its rounds: 'the context window is full')."""
    with load_vocab_only(bench_pair[0]) as tokenizer:
        words = "one two three four " * 200
        text = next(words[:n] for n in range(len(words)) if len(tokenizer.tokenize(words[:n])) >= 256 - 12)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"task": "long", "prompt": text}) + "\n")
    result = invoke(*pair_args, *FAST, "--ctx", "256", "--n-predict", "4", "--k", "auto", "--prompts", str(prompts),
                    "--json", str(tmp_path / "report.json"))
    assert result.exit_code == 0, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [v["k"] for v in report["costs"]["verify"]] == [1, 3, 7]  # 15 drafts and the pending token do not fit


def test_compare_refuses_a_file_that_is_not_a_report(tmp_path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    result = CliRunner().invoke(app, ["bench", "--compare", str(other), str(other)])
    assert result.exit_code == 2 and "not a speccli bench JSON report" in result.stderr


# --- pieces ---------------------------------------------------------------------------------------


def test_configurations_and_what_is_loaded_for_them() -> None:
    def request(specs: list[str] | None, ks: list[K] | None = None) -> BenchRequest:
        return BenchRequest(PairRequest(target="t"), specs, ks, BenchSettings(), None, None)

    # --spec and --k not given (None): the pair's; given: as parsed
    assert request(None).resolved("ngram", 3) == BenchSettings(specs=("ngram",), ks=(3,))
    given = request(["ngram", "model"], ["auto", 1, 2]).resolved("model", 4)
    assert given == BenchSettings(specs=("ngram", "model"), ks=("auto", 1, 2))
    # the draft model is loaded when any source needs it, and only then
    assert request(["ngram"]).loading_request().spec == "ngram"
    assert request(["ngram", "ngram+model"]).loading_request().spec == "ngram+model"
    assert request(["ngram", "model"]).loading_request().spec == "model"
    assert request(None).loading_request().spec is None  # the pair's
    settings = BenchSettings(specs=("model", "ngram"), ks=("auto", 4))
    assert [c.label for c in settings.configurations] == ["model auto", "model K=4", "ngram auto", "ngram K=4"]


def test_theory() -> None:
    assert expected_tokens_per_verify(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_verify(1.0, 4) == 5
    assert expected_tokens_per_verify(0.0, 4) == 1
    # free drafts and a verify as cheap as one decode: the speedup is the expected tokens per verify
    assert predicted_speedup(0.8, 4, c=0.0, verify_ratio=1.0) == pytest.approx((1 - 0.8**5) / 0.2)
    assert predicted_speedup(0.8, 4, c=0.25, verify_ratio=1.0) == pytest.approx((1 - 0.8**5) / 0.2 / 2)


def test_alpha_estimate_recovers_a_geometric_acceptance() -> None:
    rng = np.random.default_rng(0)
    alpha, k = 0.7, 4
    accepted = judged = 0
    for _ in range(20000):
        kept = 0
        while kept < k and rng.random() < alpha:
            kept += 1
        accepted += kept
        judged += kept + (kept < k)
    assert estimate_alpha(accepted, judged) == pytest.approx(alpha, abs=0.01)
    assert estimate_alpha(0, 0) is None


def test_alpha_is_one_when_every_draft_is_kept_even_a_shorter_last_one() -> None:
    """K=2 steps, then a last step with room for 1 draft (the reply's end): all kept, so alpha = 1.
    (Judged counts derived from the per-position lists gave 5/6 here: 0.83 on Gemma with --n-predict 8.)"""
    stats = RunStats()
    for drafted in (2, 2, 1):
        stats.add(StepEvent(drafted, drafted, 0.0, 0.0, 0.0, "model"))
    stats += RunStats()
    assert stats.positions.judged == stats.accepted == 5
    assert estimate_alpha(stats.accepted, stats.positions.judged) == 1.0
    stats.add(StepEvent(3, 1, 0.0, 0.0, 0.0, "model"))  # kept 1, rejected the 2nd: judged 2, the 3rd never
    assert stats.positions.judged == 7 and stats.by_source["model"].judged == 7


def test_a_taken_over_draft_counts_for_each_source_its_own_tokens() -> None:
    """2 model tokens, then 3 a lookup continued them with: 4 kept; then one whose model part failed,
    so the lookup's tokens were drafted but never judged."""
    stats = RunStats()
    stats.add(StepEvent(5, 4, 0.0, 0.0, 0.0, "model", continuation=("ngram", 3)))
    stats.add(StepEvent(5, 1, 0.0, 0.0, 0.0, "model", continuation=("ngram", 3)))
    model, ngram = stats.by_source["model"], stats.by_source["ngram"]
    assert (model.drafted, model.accepted, model.judged, model.accepted_at) == (4, 3, 4, [2, 1])
    assert (ngram.drafted, ngram.accepted, ngram.judged, ngram.drafted_at) == (6, 2, 3, [2, 2, 2])
    assert (stats.drafted_counted, stats.accepted, stats.positions.judged) == (10, 5, 7)


def test_a_step_cut_where_the_reply_ended_counts_only_the_tokens_used() -> None:
    """An end-of-generation token or a stop string inside a step's kept drafts: the drafts past it count
    as neither drafted nor kept in the acceptance figures (they had made kept drafts outnumber the
    tokens returned), while the K chosen, the take-over and the drafting cost count the whole draft."""
    step = StepEvent(5, 4, 0.01, 0.02, 0.0, "model", continuation=("ngram", 3))  # 2 model tokens, 3 taken over
    assert step.cut_to(5) == step and step.cut_to(6) == step  # all 4 kept and the target's own token used
    assert [(p.source, p.drafted, p.accepted) for p in step.cut_to(4).parts()] == [("model", 2, 2), ("ngram", 2, 2)]
    assert [(p.source, p.drafted, p.accepted) for p in step.cut_to(2).parts()] == [("model", 2, 2)]
    assert [(p.source, p.drafted) for p in step.cut_to(2).parts(as_counted=False)] == [("model", 2), ("ngram", 3)]
    stats = RunStats()
    stats.add(step.cut_to(2))
    assert (stats.drafted_counted, stats.accepted, stats.positions.judged, stats.by_source["model"].drafted) == (2, 2, 2, 2)
    assert "ngram" not in stats.by_source
    assert (stats.draft_lengths, stats.take_overs, stats.drafted_whole) == ({5: 1}, {"ngram": 1}, 5)
    plain = StepEvent(0, 0, 0.0, 0.02, 0.0)
    assert plain.cut_to(1) == plain


def test_take_overs_and_catch_ups_are_counted_and_shown() -> None:
    """Two steps in which a lookup took the model's draft over (2 model tokens, then 3), summed over two
    runs, and one model draft after a catch-up of 0.02 s."""
    first, second = RunStats(), RunStats()
    first.add(StepEvent(5, 4, 0.02, 0.1, 0.0, "model", continuation=("ngram", 3), compute_seconds=0.1))
    second.add(StepEvent(3, 3, 0.05, 0.1, 0.0, "model", catch_up_seconds=0.02, compute_seconds=0.1))
    second.add(StepEvent(5, 5, 0.02, 0.1, 0.0, "model", continuation=("ngram", 3), compute_seconds=0.1))
    stats = first + second
    assert stats.take_overs == {"ngram": 2} and stats.catch_up_seconds == pytest.approx(0.02)
    sources = Summary.model_construct(by_source=_by_source(stats))
    assert by_source_text(sources) == (
        "model 1.00 (7/7 kept in 3 steps, α 1.00) · ngram 0.83 (5/6 kept in 2 steps, 2 of them taking a draft over, α 0.83)"
    )
    # 0.09 s drafting, 0.3 s verifying, 0.01 s between steps; 0.3 s in llama.cpp's decode, so 0.1 s the host's
    # over 3 steps and 16 target rows (13 drafts and 3 of the target's own)
    split = _time_split(stats, wall_seconds=0.4)
    host = "host 6250 µs/row, 33333 µs/step"
    assert _split_text(split, True) == f"draft 22% (catch-up 5%) · target 75% · other 0% · between steps 2% · {host}"
    assert _split_text(split, False) == f"target 75% · other 0% · between steps 2% · {host}"
    # A draft model's prompt, taken in at its first draft: the prefill's time, shown beside the split.
    stats.add(StepEvent(2, 2, 0.0, 0.0, 0.0, "model", prompt_seconds=0.1))
    assert stats.prefill_seconds == stats.draft_prompt_seconds == pytest.approx(0.1)
    assert _split_text(_time_split(stats, wall_seconds=0.4), True).startswith("draft 22% (catch-up 5%) · + draft's prompt 25% · target")


def test_in_run_draft_cost_is_per_drafted_token_without_the_steps_that_drafted_nothing() -> None:
    """A draft model asked on 1,000 steps (0.01 ms each: the policy's plan) that drafted 2 tokens in one
    step of 0.4 ms: its tokens cost 0.2 ms each, not (10 + 0.4) / 2 ms (on the tiny pair bench printed
    c = 124 so)."""
    plain = Measurement(task="t", prompt_index=0, run=0, mode="target", spec=None, k=0, seed=0, reason="max_tokens",
                        decode_wall_seconds=1.0, stats=RunStats())
    spec = plain.model_copy(update={"mode": "speculative", "spec": "model", "k": None, "stats": RunStats()})
    for _ in range(1000):
        plain.stats.add(StepEvent(0, 0, 0.0, 0.001, 0.0))
        spec.stats.add(StepEvent(0, 0, 0.00001, 0.001, 0.0))
    spec.stats.add(StepEvent(2, 2, 0.0004, 0.0012, 0.0, "model"))
    configuration = Configuration("model", AUTO_K)
    costs = Costs(position=0, reps=1, target_decode_1_seconds=0.001, draft_decode_1_seconds=0.0002, c=0.2, verify=[])
    summary = summarize([Round("t", 0, 0, plain, {configuration: spec})], configuration, costs)
    assert summary.observed_costs.c == pytest.approx(0.2)
    assert spec.stats.undrafted_seconds == pytest.approx(0.01)


def test_builtin_prompts_cover_the_task_kinds() -> None:
    prompts = load_prompt_set(None)
    assert prompts.tasks == BUILTIN_TASKS
    assert len(prompts.sha256) == 64


def test_jsonl_prompts_with_and_without_task(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"task": "code", "prompt": "def f():\\n"}\n\n{"prompt": "Hello"}\n')
    prompts = load_prompt_set(path)
    assert [(p.task, p.prompt) for p in prompts.prompts] == [("code", "def f():\n"), ("prompt", "Hello")]


def test_auto_and_the_report_read_the_pairs_one_cost_profile(bench_pair, tmp_path, monkeypatch) -> None:
    """Two `auto` configurations and a fixed K: every cost probe of the run is one of the profile's
    samples (the report's `reps`), each timing auto's widest verify PROFILE_TIMINGS times; no
    configuration profiles the pair again."""
    timed_widest = widest_verify_timings(monkeypatch, bench_pair[0])
    calibrated = []
    calibrate = AutoK.calibrate
    monkeypatch.setattr(AutoK, "calibrate", lambda policy, costs: (calibrated.append(costs), calibrate(policy, costs)))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nOnce upon a time\n")
    result = invoke("--target", str(bench_pair[0]), "--draft", str(bench_pair[1]), *FAST, "--prompts", str(prompts),
                    "--spec", "model,ngram+model", "--k", "auto,2", "--json", str(tmp_path / "report.json"))
    assert result.exit_code == 0, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["costs"]["reps"] == 2 + 2  # two before the (here no) warm-up, one after each of 2 rounds
    assert timed_widest == [25] * PROFILE_TIMINGS * report["costs"]["reps"]
    assert report["costs"]["verify"][-1]["tokens"] == 25
    assert [v["tokens"] for v in report["costs"]["verify"]] == [2, 3, 4, 8, 16, 25]  # K=2's 3 rows beside auto's
    # Each auto starts from the same profile, at its own sizes only (the fixed K's 3 rows left out), with the draft's cost.
    assert len(calibrated) == 2 and calibrated[0] is calibrated[1]
    assert set(calibrated[0].decode_seconds) == {1, 2, 4, 8, 16, 25} and calibrated[0].draft_costs["model"].token_seconds > 0
