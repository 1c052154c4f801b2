"""The device check's own arithmetic (.ci/device/check.py), where it can be checked without a GPU:
its chi-square p-values (the device has no scipy, so check.py computes them in closed form) and the
size of the models it writes (the device target must hold 1-2 GB of F16 weights)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from scipy import stats

CHECK_PY = Path(__file__).resolve().parent.parent / ".ci" / "device" / "check.py"


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


def test_device_target_holds_one_to_two_gigabytes(check) -> None:
    scale = check.SCALES["device"]
    weights = scale.layer_bytes() * scale.target_layers
    assert 1e9 <= weights <= 2e9, weights
    assert scale.draft_layers * 4 <= scale.target_layers  # a draft at most a quarter of the target's cost


def test_written_models_match_the_size_arithmetic(check, tmp_path: Path) -> None:
    scale = check.SCALES["rehearse"]
    written = check.write_models(scale, tmp_path)
    # Beyond the layers: embeddings and output head (vocab 512, F16), norms, vocabulary and header.
    slack = 2 * 2 * 512 * scale.n_embd + 200_000
    for name, layers in (("target", scale.target_layers), ("draft", scale.draft_layers)):
        size = Path(written[name]).stat().st_size
        assert scale.layer_bytes() * layers <= size <= scale.layer_bytes() * layers + slack, (name, size)
