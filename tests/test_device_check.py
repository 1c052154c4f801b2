"""The device check (.ci/device/check.py), where it can be checked without a GPU: its chi-square
p-values (the device has no scipy, so check.py computes them in closed form), the size of the models
it writes (the device target must hold several GB of F16 weights), and every step run here at the
rehearsal scale, so that the steps keep up with the engine (the first lent GPU run found three calls
of an older API in them)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
CHECK_PY = ROOT / ".ci" / "device" / "check.py"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("device_check", CHECK_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize("df", [1, 2, 3, 8, 51, 200, 513])
def test_chi2_survival_equals_scipy(check, df: int) -> None:
    for x in [0.01, 0.5, 1.0, 3.0, df * 0.8, float(df), df * 1.3, 50.0, 300.0, 900.0]:
        expected = stats.chi2.sf(x, df)
        assert check.chi2_survival(x, df) == pytest.approx(expected, rel=1e-9, abs=1e-300), (x, df)


def test_chi_square_p_value_separates_a_fair_sample_from_a_biased_one(check) -> None:
    expected = {(1, 2): 0.5, (1, 3): 0.3, (4,): 0.2}
    fair = [(1, 2)] * 500 + [(1, 3)] * 300 + [(4,)] * 200
    biased = [(1, 2)] * 600 + [(1, 3)] * 250 + [(4,)] * 150
    assert check.chi_square_p_value(fair, expected)[0] == pytest.approx(1.0)
    # The lumped cell of small expectations is empty here, so the test is the plain three-cell one.
    assert check.chi_square_p_value(biased, expected)[0] == pytest.approx(
        stats.chisquare([600, 250, 150], [500, 300, 200]).pvalue, rel=1e-9)
    assert check.chi_square_p_value([(9, 9)] + fair[1:], expected)[0] == 0.0  # a pair the target never gives


def test_device_target_holds_several_gigabytes(check) -> None:
    # Memory-bound on an H200 (~1 ms a step at 4.8 TB/s, where the 1.8 GB pair was launch-bound), and
    # small enough to write beside the build and load in every tool of the race within one call.
    scale = check.SCALES["device"]
    weights = scale.layer_bytes() * scale.target_layers
    assert 4e9 <= weights <= 6e9, weights
    assert scale.draft_layers * 4 <= scale.target_layers  # a draft at most a quarter of the target's cost


def test_written_models_match_the_size_arithmetic(check, tmp_path: Path) -> None:
    scale = check.SCALES["rehearse"]
    written = check.write_models(scale, tmp_path)
    # Beyond the layers: embeddings and output head (vocab 512, F16), norms, vocabulary and header.
    slack = 2 * 2 * 512 * scale.n_embd + 200_000
    for name, layers in (("target", scale.target_layers), ("draft", scale.draft_layers)):
        size = Path(written[name]).stat().st_size
        assert scale.layer_bytes() * layers <= size <= scale.layer_bytes() * layers + slack, (name, size)


def run_step(*args: str) -> dict | None:
    done = subprocess.run([sys.executable, str(CHECK_PY), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout) if args[0] != "summary" else None


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("device-check")
    run_step("models", "--scale", "rehearse", "--dir", str(work / "models"))
    return work


def test_every_step_runs_and_passes_and_the_report_shows_each(work: Path) -> None:
    models = str(work / "models")
    load = run_step("load", "--models", models, "--ngl", "99", "--out", str(work / "load.json"))
    assert [way["loaded"] for way in load["ways"]] == [True] * len(load["ways"]) and not load["preload_llama_cpp"]
    greedy = run_step("greedy", "--models", models, "--ngl", "99", "--out", str(work / "greedy.json"))
    assert greedy["passed"] and greedy["failed"] == 0
    assert all(config["accepted"] > 0 for config in greedy["configs"])
    # 1000 samples: the broken-rule control still falls far below its threshold (p ~ 1e-39 at 3000).
    chi2 = run_step("chi2", "--models", models, "--ngl", "99", "--samples", "1000", "--out", str(work / "chi2.json"))
    assert chi2["passed"] and chi2["control_detected"]
    speed = run_step("speed", "--models", models, "--gpu-tokens", "8", "--cpu-tokens", "4", "--out", str(work / "speed.json"))
    assert speed["gpu"]["tokens_per_second"] > 0 and speed["cpu"]["tokens_per_second"] > 0
    for shapes in (speed["decode_shapes"]["reused"], speed["decode_shapes"]["rebuilt"]):
        assert list(shapes) == ["1 token", "2 tokens"] and all(len(ms) == 4 and min(ms) > 0 for ms in shapes.values())
    out = work / "out"
    out.mkdir()  # check.sh makes $OUT
    run_step("summary", "--work", str(work), "--out", str(out))
    summary = (out / "summary.txt").read_text()
    for heading in ("loading on the GPU (-ngl 99): PASSED", "greedy identity (-ngl 99, 8 prompts x 64 tokens): PASSED",
                    "chi-square, first two tokens at temperature 0.8, top-k 12 (-ngl 99): PASSED; the broken-rule control was detected",
                    "target alone, decode tok/s: GPU (-ngl 99, 8 tokens)", "a draft of 4 (graphs rebuilt), ms a decode, first taking 1 token: ",
                    "the target's weights read at ", "the race against llama.cpp's tools (race.txt):\n  not run or failed"):
        assert heading in summary, summary
    (out / "race.txt").write_text("vocabulary 512: medians of 3 interleaved rounds\n")  # as check.sh's race step leaves it
    run_step("summary", "--work", str(work), "--out", str(out))
    assert "the race against llama.cpp's tools (race.txt):\nvocabulary 512: medians" in (out / "summary.txt").read_text()


def test_a_way_of_loading_that_crashes_is_named_with_its_traceback_and_the_workaround_chosen(check, work: Path,
                                                                                            monkeypatch) -> None:
    monkeypatch.setattr(check, "LOAD_WAYS", [("crashes", "import ctypes; ctypes.string_at(0)", {}),
                                             ("loads", check._LOAD_AND_DECODE, {})])
    load = check.load_check(work / "models", 99)
    assert [(way["name"], way["loaded"]) for way in load["ways"]] == [("crashes", False), ("loads", True)]
    assert not load["passed"] and load["preload_llama_cpp"]
    lines = check.load_lines(load)
    assert lines[1] == "loading on the GPU (-ngl 99): FAILED; the later steps ran with llama_cpp imported first"
    assert lines[2].split() == ["crashes", "FAILS", "(exit", "-11)"]
    assert lines[3].strip() == "Fatal Python error: Segmentation fault"  # faulthandler's, as a crash in llama.cpp shows
