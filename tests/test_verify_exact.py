"""Exact (analytic) proof that the verification rule emits tokens distributed as the target's p.

No sampling here: the output distribution of one verification position is computed from the same
functions `verify_sampled` uses, and must equal p to 1e-12. A second test enumerates whole K-token
steps on a tiny vocabulary, so the chaining of positions (the bonus token included) is exact too. It
reads the distribution off the real `verify_sampled`'s verdicts: the K acceptance uniforms and the
one that draws the emitted token are partitioned into cells by the rule's definition (one cell per
outcome: drafts kept, token emitted), every cell is probed just inside each of its edges and in its
middle, all probes of a cell must give one verdict, and the cell's probability goes to that
verdict's tokens. So both the acceptance thresholds and the widths of every token's interval in the
residual and bonus draws are the rule's own, to 1e-12 (negative controls: a looser acceptance, one
uniform shared by all positions, two residuals of the right tokens with other widths, a bonus row a
little off; a probe in each interval's middle alone passed the residuals). The same holds for a draft
whose vocabulary is the target's first ids (control: a residual without the ids it lacks). The probes
rely on the rule being a threshold on each acceptance uniform and an inverse-CDF draw (monotone in its
uniform).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from speccli.core import verify as verify_module
from speccli.core.sampling import Distribution
from speccli.core.verify import DraftVerdict, acceptance_probabilities, residual_distribution, verify_greedy, verify_sampled


def as_distributions(rows):
    """Probability rows as the engine holds a filtered row: its support and their weights."""
    return None if rows is None else [Distribution.on_support(np.asarray(row, dtype=np.float64)) for row in rows]


def on_dense_rows(residual):
    """A residual written on dense rows (a broken one), called as the rule calls it: on distributions."""

    def on_distributions(p: Distribution, q: Distribution) -> Distribution:
        size = max(p.size, q.size)
        return Distribution.on_support(residual(p.dense(size), q.dense(size)))

    return on_distributions


def output_distribution(p: np.ndarray, q: np.ndarray, residual=residual_distribution) -> np.ndarray:
    """P(emitted = y) at one position, when x ~ q is accepted with min(1, p(x)/q(x)), else y ~ residual."""
    drafted = np.flatnonzero(q > 0)
    accept = np.zeros_like(p)
    accept[drafted] = q[drafted] * acceptance_probabilities(p[drafted], q[drafted])
    rejection_mass = 1.0 - accept.sum()
    if rejection_mass <= 1e-15:
        return accept
    return accept + rejection_mass * residual(*as_distributions([p, q])).dense()


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
    np.testing.assert_array_equal(residual_distribution(*as_distributions([p, p + np.float32(1e-8)])).dense(), p)


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


# Probes sit this far inside a cell's edges, in the space of the uniforms: a rule whose own edges are
# elsewhere by more gives two verdicts in one cell, and the distribution read off the verdicts holds to
# about this much per cell.
EDGE = 1e-12


def probes(low: float, high: float) -> list[float]:
    """Uniforms in the cell [low, high): just inside both edges, and the middle. Where the cell is under
    4 EDGE wide (it holds under 4e-12 of probability) its middle alone, and none if no float lies in it."""
    middle = (low + high) / 2
    if high - low >= 4 * EDGE:
        return [low + EDGE, middle, high - EDGE]
    return [middle] if low <= middle < high else []


def reference_acceptance(drafted, q_rows, p_rows) -> np.ndarray:
    """The rule's acceptance probability at each drafted position, from its definition (not verify.py's
    code): min(1, p(x)/q(x)) where x was drawn from q (the first len(q_rows)), p(x) where proposed with
    certainty."""
    drawn = 0 if q_rows is None else len(q_rows)
    return np.array([
        min(1.0, p_rows[i][x] / q_rows[i][x]) if i < drawn else p_rows[i][x] for i, x in enumerate(drafted)
    ])


def reference_emission(drafted, q_rows, p_rows, n_accepted: int) -> np.ndarray:
    """What the token after `n_accepted` kept drafts is drawn from, by definition: the bonus row p_k, or at a
    rejection norm(max(0, p - q)), with q = one-hot(x) where x was proposed with certainty."""
    k, drawn = len(drafted), 0 if q_rows is None else len(q_rows)
    if n_accepted == k:
        return p_rows[k]
    p = p_rows[n_accepted]
    q = q_rows[n_accepted] if n_accepted < drawn else np.eye(len(p))[drafted[n_accepted]]
    q = np.r_[q, np.zeros(len(p) - len(q))]  # a draft of a smaller vocabulary: 0 on the ids it lacks
    residual = np.maximum(p - q, 0)
    return residual / residual.sum() if residual.sum() > 0 else p


def step_cells(drafted, q_rows, p_rows):
    """The partition of one step's uniforms (K acceptance uniforms, then the one that draws the emitted
    token) into cells, one per outcome (n_accepted, token), by the rule's definition. Yields each cell's
    probability with the uniforms that probe it: acceptance vectors at the cell's low corner, its high
    corner, at the thresholds (kept drafts just below theirs, the rejected one just above), and in its
    middle, each with the emitted token's uniform just inside both edges of its interval and in its middle."""
    k = len(drafted)
    accept = reference_acceptance(drafted, q_rows, p_rows)
    for n_accepted in range(k + 1):
        columns = [probes(0.0, a) for a in accept[:n_accepted]]
        if n_accepted < k:
            columns.append(probes(accept[n_accepted], 1.0))
        if not all(columns):
            continue  # the outcome is impossible (or narrower than a float)
        unread = [0.5] * (k - len(columns))  # past the rejection
        corners = {}
        for kept, rejected in [(0, 0), (2, 2), (2, 0), (1, 1)]:
            picks = [kept] * n_accepted + [rejected] * (n_accepted < k)
            vector = tuple(column[min(pick, len(column) - 1)] for column, pick in zip(columns, picks))
            corners[vector] = np.array([*vector, *unread])
        outcome = np.prod(accept[:n_accepted]) * (1 - accept[n_accepted] if n_accepted < k else 1)
        emission = reference_emission(drafted, q_rows, p_rows, n_accepted)
        edges = np.concatenate([[0.0], np.cumsum(emission)]) / emission.sum()
        for token in np.flatnonzero(emission > 0):
            sample_uniforms = probes(edges[token], edges[token + 1])
            if sample_uniforms:
                yield (n_accepted, int(token)), outcome * emission[token], list(corners.values()), sample_uniforms


def step_distribution(drafted, q_rows, p_rows, verify=verify_sampled) -> dict[tuple[int, ...], float]:
    """The distribution of what one step emits (kept drafts and the next token), read off `verify`'s own
    verdicts: every cell of the partition above is probed, all its probes must give one verdict (else the
    rule's edges are not where its definition puts them: a residual or acceptance of other widths), and the
    cell's probability goes to what that verdict emits, whatever the cell was expected to give."""
    chosen = np.array(drafted, dtype=np.int64)
    q_distributions, p_distributions = as_distributions(q_rows), as_distributions(p_rows)
    emitted: dict[tuple[int, ...], float] = {}
    for cell, probability, accept_vectors, sample_uniforms in step_cells(drafted, q_rows, p_rows):
        verdicts = {
            verify(chosen, q_distributions, p_distributions, ScriptedUniforms(uniforms, u))
            for uniforms in accept_vectors for u in sample_uniforms
        }
        assert len(verdicts) == 1, f"the rule gives {sorted(verdicts, key=str)} within the cell of {cell}"
        (verdict,) = verdicts
        tokens = tuple(int(x) for x in drafted[: verdict.n_accepted]) + (verdict.next_token,)
        emitted[tokens] = emitted.get(tokens, 0.0) + probability
    return emitted


class TinyLanguageModel:
    """A distribution over the next token for every prefix, fixed by a seed."""

    def __init__(self, seed: int, vocab: int, sparsity: float) -> None:
        self.seed, self.vocab, self.sparsity = seed, vocab, sparsity

    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        return random_distribution(rng, self.vocab, self.sparsity)


def speculative_then_target(target: TinyLanguageModel, draft: TinyLanguageModel, k: int, verify=verify_sampled) -> dict:
    """Exact distribution of k+1 tokens made by one verify step (every draft sequence, and what the real
    `verify_sampled` emits for it, read off its verdicts over the whole partition of its uniforms), topped
    up with target-only tokens to k+1. Speculative decoding is exact iff this equals the target's joint."""
    joint: dict[tuple[int, ...], float] = {}
    for drafted in itertools.product(range(draft.vocab), repeat=k):
        q_rows = np.array([draft(drafted[:i]) for i in range(k)])
        p_rows = np.array([target(drafted[:i]) for i in range(k + 1)])
        drafted_probability = np.prod(q_rows[np.arange(k), drafted])
        if drafted_probability == 0:
            continue
        for emitted, probability in step_distribution(drafted, q_rows, p_rows, verify).items():
            weight = drafted_probability * probability
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


STEP_CASES = [(1, 4, 0), (2, 3, 1), (3, 3, 2), (2, 4, 3)]  # (k, vocab, seed)


def assert_step_is_exact(k: int, vocab: int, seed: int, sparsity: float, verify=verify_sampled,
                         draft_vocab: int | None = None) -> None:
    """`draft_vocab`: a draft whose vocabulary is the target's first ids, which never proposes the others
    (a target padded past its draft's vocabulary, as check-vocab tolerates)."""
    target = TinyLanguageModel(seed, vocab, sparsity)
    draft = TinyLanguageModel(seed + 100, draft_vocab or vocab, sparsity)
    speculative = speculative_then_target(target, draft, k, verify)
    exact = dict(target_sequences(target, (), k + 1))
    assert set(speculative) <= set(exact)
    for sequence, probability in exact.items():
        assert abs(speculative.get(sequence, 0.0) - probability) < 1e-12, sequence


@pytest.mark.parametrize("k, vocab, seed", STEP_CASES)
@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_a_whole_step_with_its_bonus_token_is_exact(k: int, vocab: int, seed: int, sparsity: float) -> None:
    assert_step_is_exact(k, vocab, seed, sparsity)


NARROW_DRAFT_CASES = [(1, 4, 0, 3), (2, 4, 3, 2), (3, 3, 2, 2)]  # (k, vocab, seed, the draft's vocabulary)


@pytest.mark.parametrize("k, vocab, seed, draft_vocab", NARROW_DRAFT_CASES)
def test_a_step_with_a_draft_of_the_targets_first_ids_is_exact(k, vocab, seed, draft_vocab) -> None:
    assert_step_is_exact(k, vocab, seed, 0.0, draft_vocab=draft_vocab)


def residual_on_the_drafts_ids(p: Distribution, q: Distribution) -> Distribution:
    """norm(max(0, p - q)) over the draft's ids alone: the target's others dropped from the residual."""
    residual = np.maximum(p.dense(p.size)[: q.size] - q.dense(q.size), 0)
    if not residual.sum():  # as the rule's own: p where rounding leaves no residual
        return p
    return Distribution.on_support(np.r_[residual, np.zeros(p.size - q.size)] / residual.sum())


@pytest.mark.parametrize("k, vocab, seed, draft_vocab", NARROW_DRAFT_CASES)
def test_the_enumeration_detects_a_residual_without_the_ids_the_draft_lacks(k, vocab, seed, draft_vocab, monkeypatch) -> None:
    """Negative control for the narrower draft: a rejection must be able to emit what it cannot propose."""
    monkeypatch.setattr(verify_module, "residual_distribution", residual_on_the_drafts_ids)
    with pytest.raises(AssertionError):
        assert_step_is_exact(k, vocab, seed, 0.0, draft_vocab=draft_vocab)


def residual_with_a_floor(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q) + 1e-3 [p > q]): the right tokens, each interval off by about 1e-3."""
    residual = np.maximum(p - q, 0) + 1e-3 * (p > q)
    return residual / residual.sum()


def residual_of_nine_tenths_of_q(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - 0.9 q))."""
    residual = np.maximum(p - 0.9 * q, 0)
    return residual / residual.sum()


# The step cases where both broken residuals below differ from the right one at some rejection that can
# happen (by 7e-6 for p - 0.9 q in the first). In the others, wherever a rejection can happen p > q on
# one token only, so the floored residual is the right one, and in two sparse ones p - 0.9 q is too.
RESIDUAL_CASES = [(1, 4, 0, 0.5), (2, 3, 1, 0.0), (3, 3, 2, 0.0), (2, 4, 3, 0.0), (2, 4, 3, 0.5)]


@pytest.mark.parametrize("k, vocab, seed, sparsity", RESIDUAL_CASES)
@pytest.mark.parametrize(
    "broken", [residual_with_a_floor, residual_of_nine_tenths_of_q], ids=["p>q floored by 1e-3", "p - 0.9 q"]
)
def test_the_enumeration_detects_a_residual_of_other_widths(broken, k, vocab, seed, sparsity, monkeypatch) -> None:
    """Negative controls: residuals that draw the right tokens (a point in the middle of each token's
    interval still gives it: the enumeration that probed only there passed both) with intervals of
    other widths. Probed just inside both edges of every interval, they give two verdicts in a cell."""
    monkeypatch.setattr(verify_module, "residual_distribution", on_dense_rows(broken))
    with pytest.raises(AssertionError):
        assert_step_is_exact(k, vocab, seed, sparsity)


@pytest.mark.parametrize("k, vocab, seed", [case for case in STEP_CASES if case[0] > 1])
def test_the_enumeration_detects_a_bonus_drawn_from_a_row_a_little_off(k, vocab, seed) -> None:
    """Negative control for the bonus token at k > 1: drawn from p_k mixed with 1e-3 of the uniform row."""

    def off_bonus(drafted, q, p, rng):
        bonus = Distribution.on_support(0.999 * p[k].dense() + 1e-3 / p[k].size)
        return verify_sampled(drafted, q, [*p[:k], bonus], rng)

    with pytest.raises(AssertionError):
        assert_step_is_exact(k, vocab, seed, 0.0, verify=off_bonus)


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
