"""The sparse path against the definition: `distribution` keeps a filtered row as its support, found
without sorting the row; here every filter is computed the direct way over the whole row (a full sort),
and the two must give the same support, the same probabilities, and the same verdicts from the same
uniforms when verifying, on random rows with ties, NaN, -inf and very small temperatures, at sizes
where candidates are found by column maxima (real vocabularies) and where every token is one.

Negative control: a top-k floor taken too high (the k/2-th largest column maximum) fails it.

A grammar's few allowed tokens are read alone (`distribution_among`): the same distribution as the whole
row masked, by the same definition; the allowed tokens' positions taken for their ids fail it.
"""
from __future__ import annotations

import numpy as np
import pytest

from speccli.core import sampling as sampling_module
from speccli.core.sampling import Distribution, SamplingParams, distribution, distribution_among, sample
from speccli.core.verify import verify_sampled
from speccli.errors import NonFiniteLogitsError


def reference_row(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The filtered distribution by definition, dense: top-k (ties with the k-th kept), then top-p over
    the top-k tokens' softmax (the tokens by logit, ties by id, while the mass before each is under
    top_p; the top token always), min-p (logit >= top + ln min_p, llama.cpp's rule), then the temperature."""
    values = logits.astype(np.float32)
    top = values.max()
    if not np.isfinite(top):
        raise NonFiniteLogitsError
    keep = np.ones(len(values), dtype=bool)
    if 0 < params.top_k < len(values):
        keep &= values >= np.sort(values)[-params.top_k]
    if params.top_p < 1:
        kept = np.flatnonzero(keep)
        untempered = np.exp(values[kept].astype(np.float64) - float(top))
        order = np.argsort(-values[kept], kind="stable")
        mass_before = np.concatenate(([0.0], np.cumsum(untempered[order])[:-1]))
        in_top_p = np.zeros(len(values), dtype=bool)
        in_top_p[kept[order[mass_before < params.top_p * sum(untempered.tolist())]]] = True
        in_top_p[kept[order[0]]] = True
        keep &= in_top_p
    if params.min_p > 0:
        keep &= values >= top + np.float32(np.log(params.min_p))
    # The weights in the engine's precision: float64 for a filter's few survivors, float32 for a dense row
    # (a draw's intervals there are so narrow that the precision moves some of their edges).
    precision = np.float64 if params.filtered else np.float32
    inverse_temperature = precision(min(max(1 / params.temperature, 1e-45), 1e30))  # the limits in float32's range
    row = np.zeros(len(values), dtype=np.float64)
    with np.errstate(over="ignore"):
        row[keep] = np.exp((values[keep].astype(precision) - precision(top)) * inverse_temperature)
    return row / row.sum()


CHAT = SamplingParams(0.8, top_k=40, top_p=0.95, min_p=0.05)
PARAMS = {
    "chat's defaults": CHAT,
    "top-k": SamplingParams(0.7, top_k=40),
    "top-k 1": SamplingParams(0.7, top_k=1),
    "top-p": SamplingParams(1.0, top_p=0.9),
    "min-p": SamplingParams(0.8, min_p=0.05),
    "top-k and min-p": SamplingParams(1.3, top_k=200, min_p=0.01),
    "temperature only": SamplingParams(0.8),
    "tiny temperature": SamplingParams(1e-39, top_k=40, top_p=0.95),
    "tiny temperature, no filter": SamplingParams(1e-30),
    # the highest a user may set (MAX_TEMPERATURE); 1e50 was allowed once, and needed 1/T kept off 0
    "highest temperature": SamplingParams(2.0, top_k=40, min_p=0.05),
    "highest temperature, no filter": SamplingParams(2.0),
}


def random_logits(rng: np.random.Generator, size: int, kind: str) -> np.ndarray:
    """Logits as a language model's: a few tokens far ahead of a broad tail."""
    logits = rng.standard_normal(size).astype(np.float32) * 2
    logits[rng.integers(size, size=rng.integers(1, 60))] += rng.uniform(4, 14)
    if kind == "ties":  # logits on a coarse grid: many values equal, the k-th largest among them
        logits = np.round(logits * 2) / 2
    elif kind == "-inf":  # masked tokens
        logits[rng.random(size) < 0.3] = -np.inf
    elif kind == "10 unmasked":  # fewer tokens left than top-k keeps
        logits[np.argsort(rng.random(size))[10:]] = -np.inf
    elif kind == "clustered":  # the likely tokens side by side: many in one column, or in one stripe
        width = min(100, size // 2)
        start = rng.integers(size - width)
        logits[start:start + width] += 12
    return logits.astype(np.float32)


KINDS = ["plain", "ties", "-inf", "10 unmasked", "clustered"]
SIZES = [50, 500, 40_000, 151_936]  # 50: no whole column, and top-k 200 past the vocabulary


def rows_of(params: SamplingParams, size: int, kind: str, seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, size, KINDS.index(kind)])
    return [random_logits(rng, size, kind) for _ in range(count)]


@pytest.mark.parametrize("name", PARAMS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_the_sparse_row_is_the_definitions(name: str, size: int, kind: str) -> None:
    params = PARAMS[name]
    for logits in rows_of(params, size, kind, seed=0, count=3):
        expected = reference_row(logits, params)
        found = distribution(logits, params)
        assert (found.dense() > 0).tolist() == (expected > 0).tolist() or found.ids is None
        np.testing.assert_allclose(found.dense(), expected, rtol=2e-6, atol=1e-12)


@pytest.mark.parametrize("name", PARAMS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_sparse_and_dense_rows_give_the_same_verdicts_from_the_same_uniforms(name: str, size: int, kind: str) -> None:
    """A draft model's 3 tokens, then a lookup's 3, verified against rows built both ways: the engine's
    (`distribution`) and the definition's, dense; the same seed must give the same verdict every time."""
    params = PARAMS[name]
    rows = rows_of(params, size, kind, seed=1, count=7)
    p_rows = [distribution(row, params) for row in rows[:4]]
    p_dense = [Distribution(None, reference_row(row, params), size) for row in rows[:4]]
    q_logits = [row + np.float32(0.5) * np.random.default_rng(i).standard_normal(size).astype(np.float32)
                for i, row in enumerate(rows[:3])]
    q_rows = [distribution(row, params) for row in q_logits]
    q_dense = [Distribution(None, reference_row(row, params), size) for row in q_logits]
    verdicts = 0
    for seed in range(20):
        drafted = np.array([sample(q, np.random.default_rng([seed, i])) for i, q in enumerate(q_rows)])
        lookup = np.array([int(np.argsort(row)[-1 - seed % 3]) for row in rows[:3]])
        for chosen, q, q_ref in [(drafted, q_rows, q_dense), (lookup, None, None)]:
            sparse = verify_sampled(chosen, q, p_rows, np.random.default_rng(seed))
            dense = verify_sampled(chosen, q_ref, p_dense, np.random.default_rng(seed))
            assert sparse == dense, (seed, chosen)
            verdicts += sparse.n_accepted < len(chosen)
    assert verdicts or name.startswith("tiny"), "no draft was ever rejected: the residuals went unchecked"


@pytest.mark.parametrize("name", PARAMS)
def test_nan_and_all_masked_rows_are_refused_on_both_paths(name: str) -> None:
    logits = rows_of(PARAMS[name], 40_000, "plain", seed=2, count=1)[0]
    for broken in (np.nan, np.inf, "all -inf"):
        row = logits.copy()
        if broken == "all -inf":
            row[:] = -np.inf
        else:
            row[12_345] = broken
        with pytest.raises(NonFiniteLogitsError):
            distribution(row, PARAMS[name])
        with pytest.raises(NonFiniteLogitsError):
            reference_row(row, PARAMS[name])


def test_a_top_k_floor_taken_too_high_is_detected(monkeypatch) -> None:
    """Negative control: a floor at the k/2-th largest column maximum instead of the k-th leaves top-k
    tokens out of the candidates; the comparison with the definition fails."""
    monkeypatch.setattr(sampling_module, "_top_k_floor", lambda column_max, k: np.sort(column_max)[-max(1, k // 2)])
    with pytest.raises(AssertionError):
        test_the_sparse_row_is_the_definitions("top-k", 151_936, "plain")


# --- a grammar's few allowed tokens, read alone ----------------------------------------------------------

ALLOWED = [1, 3, 40, 300]  # 300: more than the plain-Python path takes


@pytest.mark.parametrize("name", [*PARAMS, "greedy"])
@pytest.mark.parametrize("size", [500, 151_936])
def test_the_allowed_tokens_alone_give_the_masked_rows_distribution(name: str, size: int) -> None:
    params = PARAMS.get(name, SamplingParams(0.0))
    rng = np.random.default_rng([3, size])
    for allowed in ALLOWED:
        logits = random_logits(rng, size, "plain")
        ids = np.sort(rng.choice(size, allowed, replace=False))
        masked = np.full(size, -np.inf, dtype=np.float32)
        masked[ids] = logits[ids]
        if params.greedy:
            expected = np.zeros(size)
            expected[ids[np.argmax(logits[ids])]] = 1.0
        else:
            expected = reference_row(masked, params)
        found = distribution_among(ids, logits[ids], params, size)
        np.testing.assert_allclose(found.dense(), expected, rtol=2e-6, atol=1e-12, err_msg=f"{allowed} allowed")
        with pytest.raises(NonFiniteLogitsError):  # none allowed: a draft's row narrower than the grammar's
            distribution_among(ids[:0], logits[:0], params, size)


@pytest.mark.parametrize("name", ["greedy", "chat's defaults"])
def test_the_allowed_tokens_positions_taken_for_their_ids_are_detected(name: str, monkeypatch) -> None:
    real_greedy, real_survivors = sampling_module.greedy_token, sampling_module._survivors
    monkeypatch.setattr(sampling_module, "greedy_token", lambda logits, ids=None: real_greedy(logits))
    monkeypatch.setattr(sampling_module, "_survivors",
                        lambda candidates, *rest: real_survivors(np.arange(len(candidates)), *rest))
    with pytest.raises(AssertionError):
        test_the_allowed_tokens_alone_give_the_masked_rows_distribution(name, 500)
