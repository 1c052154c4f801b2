"""Logits -> sampled distribution: each filter against a direct computation, and the sampler's draws."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from speccli.core.sampling import Distribution, SamplingParams, probabilities, sample
from speccli.core.verify import verify_greedy
from speccli.errors import NonFiniteLogitsError

LOGITS = np.array([[2.0, 1.0, 0.5, -1.0, 3.0], [0.0, 0.0, 1.0, 2.0, -5.0]], dtype=np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_temperature_only_is_softmax_of_scaled_logits() -> None:
    result = probabilities(LOGITS, SamplingParams(temperature=0.5))
    for row, logits in zip(result, LOGITS):
        np.testing.assert_allclose(row, softmax(logits / 0.5), rtol=1e-5)


def test_greedy_is_one_hot_on_the_argmax() -> None:
    result = probabilities(LOGITS, SamplingParams(temperature=0))
    np.testing.assert_array_equal(result, [[0, 0, 0, 0, 1], [0, 0, 0, 1, 0]])


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0), SamplingParams(temperature=0.8), SamplingParams(0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(0.8, top_p=0.9), SamplingParams(0.8, top_k=2),
], ids=["greedy", "temperature", "chat's filters", "top-p", "top-k"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, "all -inf"])
def test_logits_that_are_no_distribution_are_refused_in_words(params: SamplingParams, bad) -> None:
    """A model with NaN weights gives NaN logits: with chat's filters that had been a traceback ("zero-size
    array to reduction operation maximum"), greedy a reply of token 0 (argmax takes a NaN for the largest)."""
    logits = LOGITS.copy()
    if bad == "all -inf":
        logits[1] = -np.inf
    else:
        logits[1] = bad
    with pytest.raises(NonFiniteLogitsError, match=r"^a model's logits are not finite \(NaN or infinity\)"):
        probabilities(logits, params)
    with pytest.raises(NonFiniteLogitsError):
        verify_greedy(np.array([4]), logits)
    masked = LOGITS.copy()
    masked[0, :2] = -np.inf  # a token masked out is no fault
    assert probabilities(masked, params)[0, :2].tolist() == [0, 0]


@pytest.mark.parametrize("temperature", [1e-30, 1e-38, 1e-39, 1e-46, 1e-300])
@pytest.mark.parametrize("top_k", [0, 3])
def test_a_tiny_temperature_splits_the_mass_among_the_top_ties_without_nan(temperature: float, top_k: int) -> None:
    """1/temperature past float32's range made the top token's 0 * inf a NaN (a server request with
    temperature 1e-39 returned empty text); the limit is the mass shared by the tokens tied at the top."""
    logits = np.array([[1.0, 3.0, 3.0, 2.0], [0.5, -1.0, 0.25, 0.5000001]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning reaches a server's log either
        probs = probabilities(logits, SamplingParams(temperature=temperature, top_k=top_k))
    assert probs.tolist() == [[0, 0.5, 0.5, 0], [0, 0, 0, 1]]


def test_top_k_keeps_the_k_largest() -> None:
    result = probabilities(LOGITS, SamplingParams(temperature=1, top_k=2))
    np.testing.assert_allclose(result[0], np.r_[softmax(np.array([2.0, 3.0]))[0], 0, 0, 0, softmax(np.array([2.0, 3.0]))[1]], rtol=1e-5)
    assert (result[1] > 0).sum() == 2


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    row = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    kept = probabilities(row, SamplingParams(temperature=1, top_p=0.8)) > 0
    np.testing.assert_array_equal(kept, [[True, True, False, False]])  # 0.5 + 0.3 reaches 0.8
    kept = probabilities(row, SamplingParams(temperature=1, top_p=0.81)) > 0
    np.testing.assert_array_equal(kept, [[True, True, True, False]])


@pytest.mark.parametrize("top_p", [1e-3, 1e-46, 1e-300])
def test_the_tiniest_top_p_keeps_the_top_token(top_p) -> None:
    """A top_p the option check allows (> 0) but float32 holds as 0 had kept no token at all."""
    row = np.log(np.array([[0.3, 0.5, 0.2]], dtype=np.float32))
    np.testing.assert_array_equal(probabilities(row, SamplingParams(temperature=1, top_p=top_p)), [[0, 1, 0]])


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    row = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
    result = probabilities(row, SamplingParams(temperature=1, min_p=0.25))  # threshold 0.125
    np.testing.assert_allclose(result[0], np.array([0.5, 0.3, 0.15, 0]) / 0.95, rtol=1e-5)


def test_the_input_buffer_is_never_written() -> None:
    logits = LOGITS.copy()
    probabilities(logits, SamplingParams(temperature=0.7, top_k=2, top_p=0.9, min_p=0.1))
    np.testing.assert_array_equal(logits, LOGITS)


def dense(row: np.ndarray) -> Distribution:
    return Distribution(None, row, len(row))


FORMS = {"dense": dense, "support": Distribution.on_support}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("size", [7, 5000, 262_144])
def test_sample_draws_the_given_distribution(size: int, form: str) -> None:
    rng = np.random.default_rng(size)
    probs = np.zeros(size, dtype=np.float32)
    support = rng.choice(size, 6, replace=False)
    weights = np.array([0.05, 0.1, 0.15, 0.2, 0.2, 0.3])
    probs[support] = weights
    draws = np.array([sample(FORMS[form](probs), rng) for _ in range(6000)])
    assert set(draws) <= set(support)
    counts = np.array([(draws == s).sum() for s in support])
    assert stats.chisquare(counts, weights * 6000).pvalue > 1e-3


@pytest.mark.parametrize("form", FORMS)
def test_sample_never_returns_a_zero_probability_token_at_the_edges(form: str) -> None:
    class Edge:
        def __init__(self, u: float) -> None:
            self.u = u

        def random(self) -> float:
            return self.u

    probs = np.zeros(3000, dtype=np.float32)
    probs[[10, 2047]] = 0.5
    assert sample(FORMS[form](probs), Edge(0.0)) == 10
    assert sample(FORMS[form](probs), Edge(np.nextafter(1.0, 0))) == 2047
    assert sample(FORMS[form](probs), Edge(0.5)) == 2047


@pytest.mark.parametrize("seed", range(4))
def test_top_p_on_a_large_vocabulary_matches_a_full_sort(seed: int) -> None:
    """probabilities() sorts only a head of likely tokens; the kept set must be the full sort's: tokens by
    logit, ties by id, while the mass before each (float64) is under top_p."""
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(262_144) * (seed + 1)).astype(np.float32)
    untempered = np.exp(row.astype(np.float64) - row.max())
    order = np.argsort(-row, kind="stable")
    mass_before = np.concatenate(([0.0], np.cumsum(untempered[order])[:-1]))
    expected_kept = np.zeros(row.size, dtype=bool)
    expected_kept[order[mass_before < 0.9 * untempered.sum()]] = True
    kept = probabilities(row, SamplingParams(temperature=0.7, top_p=0.9))[0] > 0
    np.testing.assert_array_equal(kept, expected_kept)
    assert np.count_nonzero(kept) > 10


def test_a_temperature_of_minus_zero_is_zero() -> None:
    """`/temp -0` said "(temperature = -0, greedy)"."""
    from speccli.validation import check_temperature

    assert f"{check_temperature(-0.0):g}" == "0"
