"""quant-check's pure parts: the sequential-mode reference store, the verdict rule, derived figures."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from speccli.checks.distributions import RowComparator, log_softmax
from speccli.checks.reference_store import STORED_RANGE, ReferenceStore
from speccli.checks.verdict import Fidelity, judge
from speccli.core.sampling import SamplingParams
from speccli.errors import SpeccliError


def test_reference_store_keeps_log_probabilities_to_a_fraction_of_a_millinat(tmp_path) -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((5, 4096)) * 6).astype(np.float32)
    log_p = log_softmax(logits)
    store = ReferenceStore(tmp_path, 5, 4096)
    store.write(0, log_p)
    back = store.read(0, 5)
    kept = log_p >= log_p.max(axis=1, keepdims=True) - STORED_RANGE
    assert np.abs(back[kept] - log_p[kept]).max() < 2e-4
    assert np.isneginf(back[~kept]).all() and (~kept).any()


def test_stored_reference_gives_the_same_figures_as_exact_rows(tmp_path) -> None:
    rng = np.random.default_rng(1)
    p_logits = (rng.standard_normal((4, 2048)) * 3).astype(np.float32)
    q_logits = p_logits + rng.standard_normal((4, 2048)).astype(np.float32) * 0.3
    comparator = RowComparator(SamplingParams(temperature=1.0))
    exact = comparator.compare(comparator.reference(p_logits), q_logits)
    store = ReferenceStore(tmp_path, 4, 2048)
    store.write(0, log_softmax(p_logits))
    stored = comparator.compare(comparator.reference_from_log_p(store.read(0, 4)), q_logits)
    np.testing.assert_allclose(stored[0], exact[0], atol=1e-3)  # acceptance
    np.testing.assert_allclose(stored[1], exact[1], atol=1e-3)  # KL
    assert (stored[2] == exact[2]).all()


def test_identical_rows_score_acceptance_one_and_kl_zero() -> None:
    logits = np.random.default_rng(2).standard_normal((3, 1000)).astype(np.float32)
    comparator = RowComparator(SamplingParams(temperature=1.0))
    acceptance, kl, same_top, _, broken = comparator.compare(comparator.reference(logits), logits.copy())
    np.testing.assert_allclose(acceptance, 1.0, atol=1e-5)
    np.testing.assert_allclose(kl, 0.0, atol=1e-6)
    assert same_top.all() and not broken.any()


def test_a_row_with_a_nan_or_infinite_logit_or_every_token_masked_accepts_nothing() -> None:
    """np.nansum had made such a row's KL 0, and NaN failed every comparison of the verdict rule: a
    candidate whose every row was NaN came out DEGRADED, KL 0.0000, exit 0."""
    logits = np.random.default_rng(4).standard_normal((5, 1000)).astype(np.float32)
    candidate = logits.copy()
    candidate[1, 7], candidate[2, :], candidate[3, 0], candidate[4, :] = np.nan, np.nan, np.inf, -np.inf
    comparator = RowComparator(SamplingParams(temperature=0.7, top_k=40))
    acceptance, kl, same_top, _, broken = comparator.compare(comparator.reference(logits), candidate)
    assert broken.tolist() == [False, True, True, True, True]
    assert acceptance[0] == pytest.approx(1.0, abs=1e-5) and (acceptance[1:] == 0).all()
    assert np.isinf(kl[1:]).all() and same_top.tolist() == [True, False, False, False, False]
    masked = logits.copy()
    masked[0, 5] = -np.inf  # a token masked out: a model may do that
    assert not comparator.compare(comparator.reference(logits), masked)[4].any()
    assert judge(0.0, [], broken=4, positions=5) == (Fidelity.BROKEN, "logits not finite (NaN or infinity) at 4 of 5 positions")


def test_a_stored_reference_against_itself_never_gives_a_negative_kl(tmp_path) -> None:
    # The store's rounding (0.00037-nat steps, the tail dropped) made these -1e-6 before KL was clamped.
    logits = (np.random.default_rng(3).standard_normal((6, 4096)) * 4).astype(np.float32)
    comparator = RowComparator(SamplingParams(temperature=1.0))
    store = ReferenceStore(tmp_path, 6, 4096)
    store.write(0, log_softmax(logits))
    _, kl, _, _, _ = comparator.compare(comparator.reference_from_log_p(store.read(0, 6)), logits.copy())
    assert (kl >= 0).all() and kl.max() < 1e-4


def test_acceptance_against_itself_is_a_probability() -> None:
    """Σ min(p, q) of a row with itself is Σ p, which float32 rounding can put above 1 (a model checked
    against its own file reported 1.0000000004): it is held at 1."""
    rows = (np.random.default_rng(5).standard_normal((64, 4096)) * 3).astype(np.float32)
    comparator = RowComparator(SamplingParams(temperature=1.0))
    acceptance, _, _, _, _ = comparator.compare(comparator.reference(rows), rows.copy())
    assert acceptance.max() == 1.0 and acceptance.min() > 0.999


@pytest.mark.parametrize(
    ("acceptance", "stretches", "expected"),
    [
        (0.976, [("0-31", 96, 0.97)], Fidelity.OK),
        (0.661, [("0-31", 96, 0.67)], Fidelity.DEGRADED),
        (0.020, [("0-31", 96, 0.01)], Fidelity.BROKEN),
        (0.850, [("0-255", 256, 0.95), ("256-511", 200, 0.10)], Fidelity.BROKEN),  # breaks past some length
        (0.950, [("0-255", 256, 0.96), ("256-511", 8, 0.10)], Fidelity.OK),  # too few positions to judge a stretch
    ],
)
def test_verdict_rule(acceptance, stretches, expected) -> None:
    assert judge(acceptance, stretches, broken=0, positions=500)[0] is expected


def test_a_verdict_from_a_few_positions_says_it_rests_on_too_little_text() -> None:
    """A `--text` of one word gave a plain OK from 2 positions."""
    assert judge(0.95, [("0-31", 2, 0.95)], broken=0, positions=2) == (
        Fidelity.OK, "expected acceptance 0.950 >= 0.90 (from only 2 positions, too few to rely on: give a longer "
                     "--text or more --prompts)"
    )
    assert judge(0.95, [("0-63", 64, 0.95)], broken=0, positions=64) == (Fidelity.OK, "expected acceptance 0.950 >= 0.90")




def test_a_full_temporary_folder_is_one_line_before_any_row_is_written(tmp_path, monkeypatch) -> None:
    """The reference's rows are memory-mapped: a write finding the disk full would end the process with
    SIGBUS. The file's blocks are allocated first, so a full disk is an error that can be worded."""
    def full(descriptor: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    folder = tmp_path / "speccli-quant-check-x"
    folder.mkdir()
    with pytest.raises(SpeccliError) as refused:
        ReferenceStore(folder, 1000, 262_144)
    assert str(refused.value) == (f"{tmp_path}: no room for the 524.3 MB of reference rows quant-check's sequential mode "
                                  "keeps there (No space left on device); point TMPDIR at a folder with more space")


def test_a_file_system_that_cannot_reserve_blocks_gets_a_sparse_file_as_before(tmp_path, monkeypatch) -> None:
    def unsupported(descriptor: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported, raising=False)
    store = ReferenceStore(tmp_path, 10, 4096)
    assert os.stat(tmp_path / "reference-log-p.u16").st_size == 10 * 4096 * 2 and store.codes.shape == (10, 4096)


def test_the_reference_rows_file_is_allocated_whole(tmp_path) -> None:
    store = ReferenceStore(tmp_path, 10, 4096)
    stat = os.stat(tmp_path / "reference-log-p.u16")
    assert stat.st_size == 10 * 4096 * 2 and store.codes.shape == (10, 4096)
    if hasattr(os, "posix_fallocate"):
        assert stat.st_blocks * 512 >= stat.st_size  # blocks reserved, not a sparse file


def test_a_text_or_prompts_file_that_cannot_be_read_is_named_with_its_option(tmp_path) -> None:
    """quant-check's and suggest's texts: `--text DIR` had said "DIR: Is a directory", naming no option."""
    from speccli.checks.corpus import prompts_file_source, text_file_source

    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    for make, path, said in ((text_file_source, tmp_path, f"--text {tmp_path}: is a directory, not a text file"),
                             (text_file_source, empty, f"--text {empty}: the text file is empty"),
                             (prompts_file_source, empty, f"--prompts {empty}: the prompts file has no prompts")):
        with pytest.raises(SpeccliError) as refused:
            make(path)
        assert str(refused.value) == said
