"""`speccli suggest`: every candidate kind measured by its real drafter on real tiny models, bad candidates
named while the others are measured, the prediction by bench's formula, and --write's file."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speccli.bench.theory import predicted_speedup
from speccli.cli.app import app
from speccli.cli.suggest import _write_pair
from speccli.errors import SpeccliError
from speccli.suggest import Candidate, Suggestion, predict
from tests.tiny_gguf import TinyConfig, gpt2_vocabulary, write_related_pair, write_tiny_gguf


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("suggest")
    target, draft = write_related_pair(directory, target_layers=6, draft_layers=2, eps=0.1)
    other = write_tiny_gguf(directory / "other-vocabulary.gguf", TinyConfig(n_layer=1, vocab=gpt2_vocabulary(512)))
    bigger = write_tiny_gguf(directory / "bigger.gguf", TinyConfig(n_layer=8))
    text = directory / "notes.txt"
    text.write_text("not a model")
    return {"target": target, "draft": draft, "other": other, "bigger": bigger, "text": text}


def run(*args: str):
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, ["suggest", *args, "-t", "1"])


def test_every_kind_is_measured_and_bad_candidates_are_named_one_line_each(files) -> None:
    missing = files["target"].parent / "missing.gguf"
    again = files["target"].parent / "again.gguf"
    again.unlink(missing_ok=True)
    again.symlink_to(files["draft"])  # the draft once more, by another name: measured once
    result = run(str(files["target"]), str(files["draft"]), str(files["other"]), "ngram", str(files["bigger"]),
                 str(files["text"]), str(missing), str(again), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    by_name = {Path(c["name"]).name: c for c in report["candidates"]}
    assert by_name[files["draft"].name]["kind"] == "same vocabulary"
    assert by_name["other-vocabulary.gguf"]["kind"] == "translated"
    assert by_name["ngram"]["kind"] == "lookup"
    for name in (files["draft"].name, "other-vocabulary.gguf", "ngram"):
        candidate = by_name[name]
        assert candidate["skipped"] is None and candidate["positions"] > 64 and 0 <= candidate["alpha"] <= 1
        assert candidate["predicted"] >= 1.0  # the target alone at worst: auto drafts nothing that loses
    assert by_name["bigger.gguf"]["skipped"].startswith("its file is no smaller than the target's")
    # Why, without the path the candidate's own fields (and the listing) name already.
    assert (by_name["notes.txt"]["skipped"], by_name["notes.txt"]["path"]) == ("not a GGUF file (starts with 'not ')", str(files["text"]))
    assert by_name["missing.gguf"]["skipped"] == "no such file"
    # What was not measured is null, not a figure (a skipped file had read as proposing everywhere).
    assert (by_name["notes.txt"]["kind"], by_name["notes.txt"]["proposing"], by_name["notes.txt"]["alpha"]) == (None, None, None)
    assert by_name["again.gguf"]["skipped"] == f"the same file as {files['draft']}"
    # No bar in a log, but a line as each candidate starts (it had been silent for minutes).
    assert [line for line in result.stderr.splitlines() if line.startswith("measuring ")] == [
        f"measuring {files['draft']} (1 of 3)", f"measuring {files['other']} (2 of 3)", "measuring ngram (3 of 3)"]
    verify = list(report["verify"].values())
    assert verify == sorted(verify), "a wider verify is never cheaper"
    predicted = [c["predicted"] for c in report["candidates"] if c["predicted"] is not None]
    assert predicted == sorted(predicted, reverse=True), "ranked by predicted speedup"
    # The draft made of the target's own first layers agrees with it far more than one of another vocabulary.
    assert by_name[files["draft"].name]["alpha"] > by_name["other-vocabulary.gguf"]["alpha"]


def test_the_report_says_what_pays_and_on_how_little_text(files, tmp_path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("a cat sat on the mat, a cat sat on the mat")
    result = run(str(files["target"]), str(files["draft"]), "--text", str(short))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"speccli suggest · target {files['target']} · acceptance on text file {short}, greedy"
    assert lines[-1].startswith(("best here: ", "nothing pays here: verifying 4 tokens costs "))
    assert result.stderr.strip().splitlines()[-1].startswith("note: the acceptance rests on ")


def test_the_prediction_is_benchs_formula_at_the_best_k() -> None:
    verify = {n: 1 + 0.05 * (n - 1) for n in range(1, 10)}  # a GPU-like flat curve
    model = Candidate("draft", Path("d.gguf"), kind="same vocabulary", alpha=0.8, c=0.1)
    predict(model, verify)
    best = max(range(1, 9), key=lambda k: predicted_speedup(0.8, k, 0.1, verify[k + 1]))
    assert (model.best_k, model.predicted) == (best, pytest.approx(predicted_speedup(0.8, best, 0.1, verify[best + 1])))
    steep = {n: 1.0 + 0.6 * (n - 1) for n in range(1, 10)}  # a CPU's: nothing pays
    losing = Candidate("draft", Path("d.gguf"), kind="same vocabulary", alpha=0.5, c=0.6)
    predict(losing, steep)
    assert (losing.best_k, losing.predicted) == (0, 1.0)
    # A lookup drafts only where it proposes: at 50% of positions, half of its gain.
    lookup = Candidate("ngram", None, kind="lookup", alpha=1.0, proposing=0.5, c=0.0)
    predict(lookup, verify)
    k = lookup.best_k
    assert lookup.predicted == pytest.approx((0.5 * (k + 1) + 0.5) / (0.5 * verify[k + 1] + 0.5))


def test_write_adds_the_winner_and_leaves_every_other_entry_alone(tmp_path) -> None:
    config = tmp_path / "models.toml"
    config.write_text('# mine\n[models.x]\npath = "x.gguf"\n')
    winner = Candidate("small", Path("small.gguf"), kind="same vocabulary", alpha=0.9, c=0.1, best_k=6, predicted=1.8)
    result = Suggestion("big", "text", {n: 1.0 for n in range(1, 10)}, [winner])
    _write_pair(config, "big", result, ["big", "small"])
    written = config.read_text()
    assert written.startswith('# mine\n[models.x]\npath = "x.gguf"\n')
    assert tomllib.loads(written)["pairs"]["big-suggested"] == {"target": "big", "draft": "small", "spec": "model", "k": 6}
    with pytest.raises(SpeccliError, match="has a pair big-suggested already"):
        _write_pair(config, "big", result, ["big", "small"])
    winner.best_k, winner.predicted = 0, 1.0
    with pytest.raises(SpeccliError, match="no candidate pays here, so no pair was written"):
        _write_pair(tmp_path / "other.toml", "big", result, ["big", "small"])
    assert not (tmp_path / "other.toml").exists()


def test_by_default_the_hugging_face_caches_ggufs_are_candidates_too(files, tmp_path, monkeypatch) -> None:
    """The real cache layout: a blob, and a snapshot's file that links to it; of a split model, its first part."""
    import huggingface_hub.constants

    repo = tmp_path / "hub" / "models--someone--tiny-draft-GGUF"
    (repo / "blobs").mkdir(parents=True)
    blob = repo / "blobs" / "0123abcd"
    blob.write_bytes(files["draft"].read_bytes())
    snapshot = repo / "snapshots" / "f00d"
    snapshot.mkdir(parents=True)
    (snapshot / "tiny-draft.gguf").symlink_to(blob)
    (snapshot / "big-00002-of-00002.gguf").symlink_to(blob)  # a later part: never a candidate of its own
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    result = run(str(files["target"]), "--json")
    assert result.exit_code == 0, result.output
    by_name = {c["name"]: c for c in json.loads(result.stdout)["candidates"]}
    assert by_name["someone/tiny-draft-GGUF/tiny-draft.gguf"]["kind"] == "same vocabulary"
    assert "ngram" in by_name and not any("00002-of" in name for name in by_name)


def test_write_gives_files_model_entries_that_every_command_then_reads(files, tmp_path, monkeypatch) -> None:
    # A pair must name registry entries: one naming file paths had broken every command (`unknown model`).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    config = tmp_path / "config" / "speccli" / "models.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[models.tiny-draft-2L]\npath = "elsewhere.gguf"\n')  # the draft's stem is taken
    winner = Candidate(str(files["draft"]), files["draft"], kind="same vocabulary", alpha=0.9, c=0.1, best_k=3, predicted=1.5)
    target = str(files["target"])
    _write_pair(config, target, Suggestion(target, "text", {}, [winner]))
    written = tomllib.loads(config.read_text())
    pair = written["pairs"][f"{files['target'].stem}-suggested"]
    assert (pair["target"], pair["draft"]) == (files["target"].stem, "tiny-draft-2L-2")
    assert written["models"][pair["target"]] == {"path": str(files["target"].resolve())}
    assert written["models"]["tiny-draft-2L-2"] == {"path": str(files["draft"].resolve())}
    runner = CliRunner()
    listed = runner.invoke(app, ["models"])
    assert listed.exit_code == 0 and f"{files['target'].stem}-suggested" in listed.stdout, listed.output
    checked = runner.invoke(app, ["check-vocab", pair["draft"], pair["target"]])
    assert checked.exit_code == 0, checked.output
    chatted = runner.invoke(app, ["chat", f"{files['target'].stem}-suggested", "-p", "hi", "-n", "2", "-t", "1", "-c", "256"])
    assert chatted.exit_code == 0, chatted.output


@pytest.mark.parametrize("make, complaint", [
    (lambda folder: folder, "a directory; name a models.toml file"),
    (lambda folder: folder / "missing" / "models.toml", "no folder"),
    (lambda folder: (folder / "bad.toml").write_text("[[[") and folder / "bad.toml", "not TOML"),
    (lambda folder: (folder / "has.toml").write_text('[pairs."tiny-target-6L-eps0.1-suggested"]\ntarget = "x"\n')
     and folder / "has.toml", "has a pair tiny-target-6L-eps0.1-suggested already"),
])
def test_a_bad_write_target_is_refused_before_anything_is_measured(files, tmp_path, make, complaint, monkeypatch) -> None:
    import speccli.suggest

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured before --write was checked")

    monkeypatch.setattr(speccli.suggest, "suggest", no_measuring)
    result = run(str(files["target"]), "ngram", "--write", str(make(tmp_path)))
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert complaint in result.stderr and len(result.stderr.splitlines()) == 1


def test_a_confirmed_measurement_decides_and_a_candidate_keeping_nothing_is_never_best() -> None:
    # As filed: a random-weight draft (alpha 0) was called the best candidate, ahead of ngram, which
    # --confirm had measured at 1.18x, and the verdict said nothing paid.
    useless = Candidate("random.gguf", Path("random.gguf"), kind="same vocabulary", alpha=0.0, c=0.3, best_k=0, predicted=1.0)
    lookup = Candidate("ngram", None, kind="lookup", alpha=0.2, proposing=0.3, c=0.0, best_k=0, predicted=1.0)
    result = Suggestion("big", "text", {n: 1.0 + 0.1 * n for n in range(1, 10)}, [useless, lookup])
    assert [c.name for c in result.ranked] == ["ngram", "random.gguf"]
    assert result.verdict().startswith("nothing pays here") and "the best candidate, ngram, keeps 0.20" in result.verdict()
    lookup.measured, useless.measured = 1.18, 0.92
    assert result.verdict() == "best here: ngram at K=auto, measured 1.18x the target alone (predicted 1.00x)"
    lookup.measured = 0.97
    assert result.verdict().endswith("keeps 0.20 of its first tokens, measured 0.97x; the target alone is as fast")


def test_a_lookup_that_proposed_nothing_is_said_so_and_a_run_measuring_nothing_fails(files) -> None:
    """A lookup with no match in the text had been said to keep "0.00 of its first tokens", and a run
    whose every candidate was skipped exited 0 as if it had measured something."""
    silent = Candidate("ngram", None, kind="lookup", alpha=None, proposing=0.0, c=0.0, best_k=0, predicted=1.0)
    result = Suggestion("big", "text", {n: 1.0 + 0.1 * n for n in range(1, 10)}, [silent])
    assert "the best candidate, ngram, proposed nothing here; the target alone is as fast" in result.verdict()
    skipped_only = run(str(files["target"]), str(files["text"]))
    assert skipped_only.exit_code == 1 and skipped_only.stdout.splitlines()[-1] == "no candidate could be measured"
    assert run(str(files["target"]), "ngram", str(files["text"])).exit_code == 0  # the control: one was measured
