"""Where `speccli bench` puts its report, on tiny real GGUF models: the JSON before the human-readable
report (a closed stdout never costs the file), through symlinks, to stdout or a FIFO, never into a place
that cannot hold it; and `--compare` reading reports: one line for a file it cannot use."""
from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import pytest
from rich.console import Console
from typer.testing import CliRunner

from speccli.bench.files import json_destination, write_report
from speccli.bench.render import render_report
from speccli.bench.report import SCHEMA_VERSION, BenchReport, report_schema
from speccli.cli.app import app
from speccli.errors import SpeccliError, StdoutError
from tests.tiny_gguf import TinyConfig, write_related_pair

# The built-in prompts run to ~900 tokens of the tiny byte-level vocabulary: a 2048-token context holds them.
FAST = ["--n-predict", "6", "--runs", "1", "--warmup", "0", "--ctx", "2048", "--threads", "1"]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Keep the sha256 cache out of the user's home (subprocesses inherit it)."""
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def bench_pair(tmp_path_factory) -> tuple[Path, Path]:
    """The conftest's related tiny pair, trained context 2048 so the built-in prompts fit."""
    return write_related_pair(
        tmp_path_factory.mktemp("pair"), target_layers=8, draft_layers=2, eps=0.05, config=TinyConfig(context_length=2048)
    )


@pytest.fixture
def pair_args(bench_pair) -> list[str]:
    return ["--target", str(bench_pair[0]), "--draft", str(bench_pair[1]), *FAST]


@pytest.fixture(scope="module")
def tiny_report_file(bench_pair, tmp_path_factory) -> Path:
    """A real `speccli bench --k 4 --json X` report of the tiny pair (the default spec: suffix+model)."""
    out = tmp_path_factory.mktemp("report") / "k4.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECCLI_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        result = CliRunner().invoke(
            app, ["bench", "--target", str(bench_pair[0]), "--draft", str(bench_pair[1]), "--k", "4", *FAST, "--json", str(out)]
        )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def tiny_report(tiny_report_file) -> BenchReport:
    return BenchReport.model_validate_json(tiny_report_file.read_text())


def validate(document: dict) -> None:
    jsonschema.validate(document, report_schema(), cls=jsonschema.Draft202012Validator)


def speccli(*args: str, **popen) -> subprocess.Popen:
    """The real command in its own process, so stdout and stderr are real file descriptors."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "speccli", *args], env=env, cwd=popen.pop("cwd", ROOT), **popen)


# --- the schema ------------------------------------------------------------------------------------


def test_k4_report_validates_against_the_schema_generated_from_the_types(tiny_report_file) -> None:
    document = json.loads(tiny_report_file.read_text())
    jsonschema.Draft202012Validator.check_schema(report_schema())
    validate(document)
    assert document["schema_version"] == SCHEMA_VERSION == 7 and document["settings"]["k"] == [4]
    assert document["settings"]["spec"] == ["suffix+model"] and document["results"][0]["label"] == "suffix+model K=4"
    # the schema requires every field the types write, nested ones included
    for name in ("results", "measurements", "greedy_check"):
        broken = {key: value for key, value in document.items() if key != name}
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)
    del document["measurements"][0]["stats"]["positions"]
    with pytest.raises(jsonschema.ValidationError, match="'positions' is a required property"):
        validate(document)


def test_schema_option_prints_the_generated_schema_and_none_is_kept_by_hand() -> None:
    result = CliRunner().invoke(app, ["bench", "--schema"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == report_schema()
    assert not (ROOT / "speccli" / "data" / "bench_schema.json").exists()


# --- issue 12 #1: the JSON first ----------------------------------------------------------------------


def test_a_closed_stdout_never_costs_the_json_file(pair_args, tmp_path) -> None:
    """`speccli bench ... --json X | head -c 10`: the reader is gone before the report is shown."""
    out = tmp_path / "report.json"
    process = speccli("bench", *pair_args, "--k", "2", "--json", str(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # nobody will read the human-readable report
    _, stderr = process.communicate(timeout=120)
    assert process.returncode != 0, "the report was not shown, so the command did not succeed"
    validate(json.loads(out.read_text()))
    assert "Traceback" not in stderr.decode()


# --- issue 12 #2: links, stdout, FIFOs ------------------------------------------------------------------


def test_json_through_a_symlink_writes_the_links_target(pair_args, tmp_path) -> None:
    real = tmp_path / "reports" / "latest.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    result = CliRunner().invoke(app, ["bench", *pair_args, "--k", "1", "--json", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(real)
    validate(json.loads(real.read_text()))
    assert sorted(p.name for p in real.parent.iterdir()) == ["latest.json"]


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_json_to_stdout_moves_the_human_report_to_stderr(pair_args, tmp_path, name) -> None:
    process = speccli("bench", *pair_args, "--k", "1", "--json", name, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr.decode()
    validate(json.loads(stdout))  # stdout is the JSON and nothing else
    assert "speccli bench · ad-hoc pair · spec suffix+model · K=1" in stderr.decode() and "greedy check" in stderr.decode()
    assert list(tmp_path.iterdir()) == [], "no file named '-' (or anything else) written"
    assert Path("/dev/stdout").is_symlink(), "/dev/stdout left as it was"


def test_json_to_a_fifo_is_written_into_it(pair_args, tmp_path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    result = CliRunner().invoke(app, ["bench", *pair_args, "--k", "1", "--json", str(fifo)])
    reader.join(timeout=10)  # the writer has closed: the reader may still be finishing its read
    if reader.is_alive():  # the run never opened the FIFO: let the reader go
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "w"):
            pass
        reader.join(timeout=10)
    assert result.exit_code == 0, result.output
    assert fifo.is_fifo(), "the FIFO was not replaced by a regular file"
    validate(json.loads(received[0]))
    assert "greedy check" in result.stdout  # the human-readable report stays on stdout


# --- issue 12 #13: a place that cannot hold the report -----------------------------------------------------


def test_json_into_proc_fails_before_measuring(pair_args) -> None:
    result = CliRunner().invoke(app, ["bench", *pair_args, "--k", "1", "--json", "/proc/x.json"])
    assert result.exit_code == 1
    assert result.stdout == ""  # nothing was measured
    assert result.stderr.strip().splitlines() == ["error: --json /proc/x.json: cannot write in /proc (No such file or directory)"]


def assert_kept(error: SpeccliError, report: BenchReport) -> None:
    """The error names the file the report was kept in, and that file holds the report."""
    kept = Path(str(error).rsplit("kept in ", 1)[1])
    try:
        assert BenchReport.model_validate_json(kept.read_text()) == report
    finally:
        kept.unlink()


def test_a_report_that_cannot_be_written_after_all_is_kept_and_named(tiny_report, tmp_path) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    destination = json_destination(folder / "r.json")  # passes: the folder is there
    shutil.rmtree(folder)  # ... and then it is a file
    folder.write_text("")
    with pytest.raises(SpeccliError, match=r"--json .*r\.json: cannot write it \(File exists\); the report is kept in ") as caught:
        write_report(destination, tiny_report)
    assert_kept(caught.value, tiny_report)


def test_report_is_written_atomically(tiny_report, tmp_path, monkeypatch) -> None:
    """A failed rename (the atomic writer's last step) leaves the old file as it was, no partial file
    beside it, and the report kept elsewhere, named in the error."""
    target = tmp_path / "r.json"
    target.write_text("old")
    destination = json_destination(target)
    real_replace, calls = os.replace, []

    def broken_replace(source, dest):
        calls.append((Path(source).name, Path(dest)))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(SpeccliError, match=r"cannot write it \(No space left on device\); the report is kept in ") as caught:
        write_report(destination, tiny_report)
    monkeypatch.setattr(os, "replace", real_replace)
    assert calls and calls[0][1] == target and calls[0][0].startswith("r.json.") and calls[0][0].endswith(".partial")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    assert_kept(caught.value, tiny_report)


def test_a_report_for_stdout_that_stdout_cannot_take_is_kept_and_named(tiny_report, monkeypatch) -> None:
    """`--json - > /dev/full`: the finished measurement is kept, as for a file."""

    class FullStdout(io.StringIO):
        def flush(self) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sys, "stdout", FullStdout())
    with pytest.raises(StdoutError, match=r"^--json -: cannot write it to stdout \(No space left on device\); the report is kept in ") as caught:
        write_report(json_destination(Path("-")), tiny_report)
    assert caught.value.exit_code == 2  # a stdout that cannot be written, as chat's `> /dev/full`
    assert_kept(caught.value, tiny_report)


def test_json_to_stdout_whose_reader_went_away_is_kept_and_named(pair_args) -> None:
    """`bench --json - | (a reader that quits at once)`: exit 141 with nothing on stderr had lost the whole
    measurement. Exit 141 still, as any command whose reader left, but the report is kept and named."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    process = speccli("bench", *pair_args, "--k", "1", "--json", "-", stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 141, stderr
    error = stderr.splitlines()[-1]
    assert error.startswith("error: --json -: the reader of stdout went away; the report is kept in "), stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    kept = Path(error.rsplit("kept in ", 1)[1])
    try:
        validate(json.loads(kept.read_text()))
    finally:
        kept.unlink()


def test_a_report_file_that_cannot_be_written_at_the_end_leaves_the_screen_report(pair_args, tmp_path, monkeypatch) -> None:
    """The measurement is shown as well as kept: the failed write had ended the command before its report."""

    def disk_full(path, write):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("speccli.bench.files.build_atomically", disk_full)
    report_file = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["bench", *pair_args, "--k", "1", "--json", str(report_file)])
    assert result.exit_code == 1, result.output
    assert "greedy check" in result.stdout and "wrote" not in result.stdout
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith(f"error: --json {report_file}: cannot write it (No space left on device); the report is kept in ")
    kept = Path(error.rsplit("kept in ", 1)[1])
    try:
        assert BenchReport.model_validate_json(kept.read_text()).settings.n_ctx == 2048
    finally:
        kept.unlink()
    assert not report_file.exists()


def test_a_report_for_a_fifo_whose_reader_left_is_kept_and_named(tiny_report, tmp_path, monkeypatch) -> None:
    """A broken pipe ends a command quietly only where it is stdout's (`| head`); a FIFO given to --json
    whose reader went away must not take the finished measurement with it."""
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    destination = json_destination(fifo)

    def reader_gone(*args, **kwargs):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr("speccli.bench.files.open", reader_gone, raising=False)
    with pytest.raises(SpeccliError, match=r"^--json .*report\.fifo: its reader went away; the report is kept in ") as caught:
        write_report(destination, tiny_report)
    assert_kept(caught.value, tiny_report)


# --- issue 12 #10: --compare with files it cannot use ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "a.json", "b.json", "--json", "out.json"], "--compare measures nothing, so --json would do nothing with it; leave it out"),
        (["--compare", "a.json", "b.json", "-n", "3", "--k", "5"],
         "--compare measures nothing, so --k, --n-predict would do nothing with it; leave them out"),
        (["--schema", "gemma3-270m"], "--schema measures nothing, so the pair argument would do nothing with it; leave it out"),
    ],
)
def test_options_that_would_be_ignored_beside_compare_or_schema_are_refused(args, message) -> None:
    result = CliRunner().invoke(app, ["bench", *args])
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {message}\n", "")


def _compare(a: Path, b: Path):
    return CliRunner().invoke(app, ["bench", "--compare", str(a), str(b)])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("models"), "not a valid bench report: models: Field required"),
        (lambda d: d["results"][0]["overall"].pop("speedup"), "not a valid bench report: results.0.overall.speedup: Field required"),
        (lambda d: d["results"][0].update(k="four"), "not a valid bench report: results.0.k: Input should be a valid integer"),
        (lambda d: d["settings"].update(temperature="hot"), "not a valid bench report: settings.temperature: Input should be a valid number"),
        (lambda d: d.update(results={}), "not a valid bench report: results: Input should be a valid array"),
        (lambda d: d.update(schema_version=1), "bench report schema version 1, this speccli reads versions 4 to 7; it was written by an older speccli"),
        (lambda d: d.update(schema_version=3), "bench report schema version 3, this speccli reads versions 4 to 7; it was written by an older speccli"),
        (lambda d: d["results"][0].pop("spec"), "not a valid bench report: results.0.spec: Field required"),
        (lambda d: d.update(schema_version="7"), "bench report schema version '7', this speccli reads versions 4 to 7"),
        (lambda d: d.update(kind="other"), "not a speccli bench JSON report"),
        (lambda d: d["results"][0]["overall"]["speedup"].update(median=float("nan")),
         "not a speccli bench JSON report (NaN is not a JSON number)"),
        (lambda d: d["settings"].update(temperature=float("-inf")),
         "not a speccli bench JSON report (-Infinity is not a JSON number)"),
        (lambda d: d["results"].append(d["results"][0]), "not a valid bench report: results: configuration "),
    ],
    ids=["missing-models", "missing-nested", "k-string", "temperature-string", "results-object", "version-1", "version-3",
         "missing-spec", "version-string", "kind", "nan", "infinity", "repeated-configuration"],
)
def test_compare_names_the_first_problem_in_one_line(tiny_report_file, tmp_path, change, message) -> None:
    document = json.loads(tiny_report_file.read_text())
    change(document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    for first, second in ((bad, tiny_report_file), (tiny_report_file, bad)):
        result = _compare(first, second)
        # Not JSON, or not a report at all: a file not what it should be (2); a report's value refused: 1.
        assert result.exit_code == (2 if message.startswith("not a speccli bench JSON report") else 1), result.output
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert lines == [f"error: {bad}: {message}"] or (len(lines) == 1 and lines[0].startswith(f"error: {bad}: {message}")), lines


def test_a_version_4_report_is_compared_as_one_that_ran_to_its_end(tiny_report_file, tmp_path) -> None:
    """Nor did a version 4 report have the host's time (5) or the draft's prompt time (6)."""
    document = json.loads(tiny_report_file.read_text())
    assert document.pop("stopped") is None
    later = {"host_us_per_row", "host_us_per_step", "draft_prompt_seconds", "draft_prompt_fraction"}

    def without_later_fields(part):
        if isinstance(part, dict):
            return {key: without_later_fields(value) for key, value in part.items() if key not in later}
        return [without_later_fields(value) for value in part] if isinstance(part, list) else part

    document = without_later_fields(document)
    assert "host_us_per_row" not in json.dumps(document)
    document["schema_version"] = 4
    older = tmp_path / "older.json"
    older.write_text(json.dumps(document))
    result = _compare(older, tiny_report_file)
    assert result.exit_code == 0, result.output
    assert "differs: nothing in models, prompts, settings or environment" in result.stdout


def test_compare_names_the_settings_that_differ(tiny_report_file, tmp_path) -> None:
    document = json.loads(tiny_report_file.read_text())
    document["settings"].update(spec=["ngram", "model"], k=[None, 2], seed=7)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(document))
    result = _compare(tiny_report_file, other)
    assert result.exit_code == 0, result.output
    words = " ".join(result.stdout.split())  # as rich wrapped them at the console's width
    assert "differs: --spec: suffix+model → ngram,model; --k: 4 → auto,2; seed: 42 → 7" in words


def test_compare_names_an_environment_that_differs(tiny_report_file, tmp_path) -> None:
    """GPU offload moves tok/s more than anything: two runs that differ in it had 'nothing' differing."""
    document = json.loads(tiny_report_file.read_text())
    environment = document["environment"]
    cores, platform = environment["cpu_count"], environment["platform"]
    environment.update(target_n_gpu_layers=0, draft_n_gpu_layers=None, cpu_count=cores + 2, platform="Other-1.0")
    other = tmp_path / "other.json"
    other.write_text(json.dumps(document))
    result = _compare(tiny_report_file, other)
    assert result.exit_code == 0, result.output
    words = " ".join(result.stdout.split())
    assert (f"differs: GPU layers (target/draft): -1/-1 → 0/none; cores: {cores} → {cores + 2}; "
            f"platform: {platform} → Other-1.0") in words


def test_compare_reads_two_reports(tiny_report_file) -> None:
    result = _compare(tiny_report_file, tiny_report_file)
    assert result.exit_code == 0, result.output
    assert "speedup A → B" in result.stdout and "nothing in models, prompts, settings or environment" in result.stdout
    assert "│ suffix+model K=4 │" in result.stdout


def test_the_footnote_explains_only_columns_the_report_has(tiny_report) -> None:
    """"target alone ±" is a column of the task table, which a report of several configurations has."""
    def footnote(report: BenchReport) -> str:
        out = Console(file=io.StringIO(), width=200)
        render_report(report, out)
        return " ".join(out.file.getvalue().split())

    assert len(tiny_report.results) == 1 and "target alone ±" not in footnote(tiny_report)
    several = tiny_report.model_copy(update={"results": [*tiny_report.results] * 2})
    assert "target alone ±: half the range" in footnote(several)


def test_the_chart_draws_the_1x_mark_past_any_bar_below_it() -> None:
    """A bar below 1.0x never covers the 1.0x mark, however it rounds (0.99 of 40 cells rounds to 40)."""
    from types import SimpleNamespace

    from speccli.bench.render import render_chart

    def result(label: str, speedup: float) -> SimpleNamespace:
        overall = SimpleNamespace(speedup=SimpleNamespace(median=speedup), predicted=None, acceptance_rate=0.5)
        return SimpleNamespace(label=label, overall=overall)

    bars = {line.split()[0]: line for line in render_chart([result("below", 0.99), result("above", 1.0)]).splitlines()[1:3]}
    assert bars["below"].startswith("below " + "█" * 39 + "│ 0.99×")
    assert bars["above"].startswith("above " + "█" * 40 + " 1.00×")


def test_a_task_name_is_shown_as_written_not_as_rich_markup(tiny_report) -> None:
    """A prompts file's task `[red]code` lost its bracketed part: rich read it as a style."""
    result = tiny_report.results[0]
    renamed = result.model_copy(update={"tasks": [task.model_copy(update={"task": "[red]code"}) for task in result.tasks]})
    for results in ([renamed], [renamed, renamed]):  # one configuration's task table, and several's
        out = Console(file=io.StringIO(), width=200)
        render_report(tiny_report.model_copy(update={"results": results}), out)
        assert "[red]code" in out.file.getvalue()
