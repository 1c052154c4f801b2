"""Exact (analytic) proof that the verification rule emits tokens distributed as the target's p.

No sampling here: the output distribution of one verification position is computed from the same
functions `verify_sampled` uses, and must equal p to 1e-12. A second test enumerates whole K-token
steps on a tiny vocabulary, so the chaining of positions (the bonus token included) is exact too: it
drives the real `verify_sampled` with uniforms just either side of each acceptance probability, so
the rule's own thresholds are what is checked (negative controls: a looser rule, one uniform shared).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from speccli.core.verify import DraftVerdict, acceptance_probabilities, residual_distribution, verify_greedy, verify_sampled


def output_distribution(p: np.ndarray, q: np.ndarray, residual=residual_distribution) -> np.ndarray:
    """P(emitted = y) at one position, when x ~ q is accepted with min(1, p(x)/q(x)), else y ~ residual."""
    drafted = np.flatnonzero(q > 0)
    accept = np.zeros_like(p)
    accept[drafted] = q[drafted] * acceptance_probabilities(p[drafted], q[drafted])
    rejection_mass = 1.0 - accept.sum()
    if rejection_mass <= 1e-15:
        return accept
    return accept + rejection_mass * residual(p, q)


def random_distribution(rng: np.random.Generator, size: int, sparsity: float = 0.0) -> np.ndarray:
    weights = rng.gamma(0.3, size=size)
    weights[rng.random(size) < sparsity] = 0
    if weights.sum() == 0:
        weights[rng.integers(size)] = 1
    return weights / weights.sum()


def one_hot(size: int, index: int) -> np.ndarray:
    row = np.zeros(size)
    row[index] = 1
    return row


CASES = {
    "q equals p": lambda rng: (d := random_distribution(rng, 50), d.copy()),
    "q zero where p is not": lambda rng: (
        random_distribution(rng, 50),
        np.where(np.arange(50) < 25, random_distribution(rng, 50), 0) / 1,
    ),
    "disjoint supports": lambda rng: (
        np.r_[random_distribution(rng, 25), np.zeros(25)],
        np.r_[np.zeros(25), random_distribution(rng, 25)],
    ),
    "one-hot p, spread q": lambda rng: (one_hot(50, 7), random_distribution(rng, 50)),
    "spread p, one-hot q": lambda rng: (random_distribution(rng, 50), one_hot(50, 7)),
    "one-hot both, different": lambda rng: (one_hot(50, 3), one_hot(50, 9)),
    "tiny probabilities": lambda rng: (
        (lambda w: w / w.sum())(np.r_[1.0, np.full(49, 1e-300)]),
        (lambda w: w / w.sum())(np.r_[np.full(49, 1e-12), 1.0]),
    ),
}


def normalized(row: np.ndarray) -> np.ndarray:
    return row / row.sum()


@pytest.mark.parametrize("case", CASES)
def test_edge_cases_emit_exactly_p(case: str) -> None:
    p, q = (normalized(row) for row in CASES[case](np.random.default_rng(0)))
    np.testing.assert_allclose(output_distribution(p, q), p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(200))
def test_random_distributions_emit_exactly_p(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(2, 400))
    p = random_distribution(rng, size, sparsity=rng.random() * 0.8)
    q = random_distribution(rng, size, sparsity=rng.random() * 0.8)
    np.testing.assert_allclose(output_distribution(p, q), p, rtol=0, atol=1e-12)


def test_the_check_detects_a_biased_rule() -> None:
    """Negative control: the same computation with the residual replaced by p (a known mistake)
    is not exact, so the 1e-12 checks above can fail."""
    rng = np.random.default_rng(1)
    p, q = random_distribution(rng, 30), random_distribution(rng, 30)
    biased = output_distribution(p, q, residual=lambda p, q: p)
    assert np.abs(biased - p).max() > 1e-3


def test_rounding_that_leaves_no_residual_falls_back_to_p() -> None:
    p = np.array([0.5, 0.5], dtype=np.float32)
    np.testing.assert_array_equal(residual_distribution(p, p + np.float32(1e-8)), p)


class ScriptedUniforms:
    """Stands in for numpy's Generator where verify_sampled draws: the uniforms are given, in order,
    one per value drawn (the K acceptance tests, then the one that samples the emitted token)."""

    def __init__(self, accept_uniforms: np.ndarray, sample_uniform: float) -> None:
        self.values = [*map(float, accept_uniforms), float(sample_uniform)]

    def random(self, size: int | None = None):
        if size is None:
            return self.values.pop(0)
        drawn, self.values = self.values[:size], self.values[size:]
        return np.array(drawn)


def uniforms_at_the_thresholds(accept: np.ndarray, n_accepted: int) -> np.ndarray:
    """Uniforms that accept the first `n_accepted` drafts and reject the next, each a hair's breadth
    from its acceptance probability (below it to accept, above it to reject): a rule that accepts with
    any other probability, or judges two positions with one uniform, gives another verdict."""
    uniforms = np.full(len(accept), 0.5)  # past the rejection: never read
    uniforms[:n_accepted] = accept[:n_accepted] * (1 - 1e-9)
    if n_accepted < len(accept):
        uniforms[n_accepted] = accept[n_accepted] + (1 - accept[n_accepted]) * 1e-9
    return uniforms


class TinyLanguageModel:
    """A distribution over the next token for every prefix, fixed by a seed."""

    def __init__(self, seed: int, vocab: int, sparsity: float) -> None:
        self.seed, self.vocab, self.sparsity = seed, vocab, sparsity

    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        return random_distribution(rng, self.vocab, self.sparsity)


def speculative_then_target(target: TinyLanguageModel, draft: TinyLanguageModel, k: int, verify=verify_sampled) -> dict:
    """Exact distribution of k+1 tokens made by one verify step (the real `verify_sampled`, driven
    through every draft sequence and accept/reject outcome by uniforms at the acceptance thresholds),
    topped up with target-only tokens to k+1. Speculative decoding is exact iff this equals the
    target's joint."""
    joint: dict[tuple[int, ...], float] = {}
    for drafted in itertools.product(range(draft.vocab), repeat=k):
        q_rows = np.array([draft(drafted[:i]) for i in range(k)])
        p_rows = np.array([target(drafted[:i]) for i in range(k + 1)])
        drafted_probability = np.prod(q_rows[np.arange(k), drafted])
        if drafted_probability == 0:
            continue
        accept = acceptance_probabilities(p_rows[np.arange(k), drafted], q_rows[np.arange(k), drafted])
        for n_accepted in range(k + 1):
            # Accept the first n_accepted drafts, reject the next one (unless all were accepted).
            outcome_probability = np.prod(accept[:n_accepted]) * (1 - accept[n_accepted] if n_accepted < k else 1)
            if outcome_probability == 0:
                continue
            uniforms = uniforms_at_the_thresholds(accept, n_accepted)
            emit_from = (
                p_rows[k] if n_accepted == k else residual_distribution(p_rows[n_accepted], q_rows[n_accepted])
            )
            cumulative = np.cumsum(emit_from)
            for token in np.flatnonzero(emit_from > 0):
                middle_of_token = (cumulative[token] - emit_from[token] / 2) / cumulative[-1]
                verdict = verify(np.array(drafted), q_rows, p_rows, ScriptedUniforms(uniforms, middle_of_token))
                assert verdict == DraftVerdict(n_accepted, int(token))
                emitted = tuple(drafted[:n_accepted]) + (int(token),)
                weight = drafted_probability * outcome_probability * emit_from[token]
                for completion, completion_probability in target_sequences(target, emitted, k + 1):
                    joint[completion] = joint.get(completion, 0.0) + weight * completion_probability
    return joint


def target_sequences(target: TinyLanguageModel, prefix: tuple[int, ...], length: int):
    """Every continuation of `prefix` to `length` tokens, with its probability under the target."""
    if len(prefix) == length:
        yield prefix, 1.0
        return
    row = target(prefix)
    for token in np.flatnonzero(row > 0):
        for sequence, probability in target_sequences(target, prefix + (int(token),), length):
            yield sequence, row[token] * probability


@pytest.mark.parametrize("k, vocab, seed", [(1, 4, 0), (2, 3, 1), (3, 3, 2), (2, 4, 3)])
@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_a_whole_step_with_its_bonus_token_is_exact(k: int, vocab: int, seed: int, sparsity: float) -> None:
    target = TinyLanguageModel(seed, vocab, sparsity)
    draft = TinyLanguageModel(seed + 100, vocab, sparsity)
    speculative = speculative_then_target(target, draft, k)
    exact = dict(target_sequences(target, (), k + 1))
    assert set(speculative) <= set(exact)
    for sequence, probability in exact.items():
        assert abs(speculative.get(sequence, 0.0) - probability) < 1e-12, sequence


class DrawnThrough:
    """A Generator whose acceptance uniforms pass through `change` (the sampling uniform untouched)."""

    def __init__(self, rng, change) -> None:
        self.rng, self.change = rng, change

    def random(self, size: int | None = None):
        return self.rng.random() if size is None else self.change(self.rng.random(size))


@pytest.mark.parametrize(
    "mistake",
    [
        lambda uniforms: np.full(len(uniforms), uniforms[0]),  # one uniform judges every position
        lambda uniforms: uniforms**2,  # accepts with sqrt(min(1, p/q))
    ],
    ids=["one uniform for all positions", "a looser acceptance"],
)
def test_the_enumeration_detects_a_rule_that_accepts_with_another_probability(mistake) -> None:
    """Negative controls: the step enumeration drives the real rule at each acceptance threshold, so
    a rule judging with other probabilities, or with correlated uniforms, gives another verdict."""
    target, draft = TinyLanguageModel(2, 3, 0.0), TinyLanguageModel(102, 3, 0.0)

    def mistaken(drafted, q, p, rng):
        return verify_sampled(drafted, q, p, DrawnThrough(rng, mistake))

    with pytest.raises(AssertionError):
        speculative_then_target(target, draft, 3, verify=mistaken)


def test_greedy_keeps_matching_drafts_then_takes_the_targets_argmax() -> None:
    logits = np.array([[0, 5, 1], [3, 0, 1], [0, 1, 9], [2, 1, 0]], dtype=np.float32)
    assert verify_greedy(np.array([1, 0, 2]), logits) == DraftVerdict(3, 0)  # all match: bonus is argmax of row 3
    assert verify_greedy(np.array([1, 2, 2]), logits) == DraftVerdict(1, 0)  # second differs: replaced by 0
    assert verify_greedy(np.array([0, 0, 2]), logits) == DraftVerdict(0, 1)
