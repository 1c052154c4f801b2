"""Exact (analytic) proof for drafts without q (n-gram lookup), and for draft lengths chosen per step.

A deterministic draft proposes x with certainty; `verify_sampled` (without q rows for it) accepts it
with probability p(x) and, at a rejection, draws from p with x removed. Here the output distribution
is read off the real functions' verdicts over the whole partition of their uniforms (each cell probed
just inside its edges: see tests/test_verify_exact.py), and must equal the target's to 1e-12: for one
position, for a whole step, and for several steps whose draft source and length are chosen from the
tokens so far (as `--k auto` and the n-gram + model chain do), including steps where a lookup takes a
draft model's draft over after tokens the model sampled. Residuals of other widths, at a lookup's
rejection or a model's, are its negative controls.
"""
from __future__ import annotations

import numpy as np
import pytest

from speccli.core import verify as verify_module
from speccli.core.sampling import Distribution
from speccli.core.verify import DraftVerdict, verify_sampled, without_token
from tests.test_verify_exact import (
    ScriptedUniforms, TinyLanguageModel, as_distributions, on_dense_rows, random_distribution, residual_with_a_floor,
    step_distribution, target_sequences,
)


def deterministic_output_distribution(p: np.ndarray, token: int, residual=without_token) -> np.ndarray:
    """P(emitted = y) at one position when `token` is proposed with certainty."""
    emitted = (1 - p[token]) * residual(Distribution.on_support(p), token).dense()
    emitted[token] += p[token]
    return emitted


@pytest.mark.parametrize("seed", range(100))
def test_one_position_emits_exactly_p(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(2, 300))
    p = random_distribution(rng, size, sparsity=rng.random() * 0.8)
    for token in (int(rng.integers(size)), int(p.argmax()), int(np.argmin(p))):
        np.testing.assert_allclose(deterministic_output_distribution(p, token), p, rtol=0, atol=1e-12)


def test_the_check_detects_a_residual_that_keeps_the_rejected_token() -> None:
    """Negative control: resampling from p itself after a rejection over-weights the proposed token."""
    p = random_distribution(np.random.default_rng(3), 20)
    token = int(p.argmax())
    biased = deterministic_output_distribution(p, token, residual=lambda p, _token: p)
    assert biased[token] - p[token] > 1e-3


def test_a_certain_proposal_with_p_one_is_always_kept() -> None:
    p = np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    verdict = verify_sampled(np.array([1]), None, as_distributions(p), ScriptedUniforms(np.array([0.999999]), 0.1))
    assert verdict == DraftVerdict(1, 0)  # kept; the bonus drawn from row 1 at uniform 0.1


def test_rounding_that_leaves_no_mass_falls_back_to_p() -> None:
    p = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    np.testing.assert_array_equal(without_token(Distribution.on_support(p), 0).dense(), p)


def enumerate_step(target: TinyLanguageModel, prefix: tuple[int, ...], drafted: tuple[int, ...], q_rows):
    """Every outcome of one verify step, read off the real rule's verdicts over the whole partition of its
    uniforms (tests/test_verify_exact.py's `step_distribution`): yields (emitted tokens, probability).

    q_rows: the rows the first len(q_rows) drafted tokens were drawn from (the caller weights by the
    probability of drawing them); the rest, or all where q_rows is None, were proposed with certainty."""
    p_rows = np.array([target(prefix + drafted[:i]) for i in range(len(drafted) + 1)])
    yield from step_distribution(drafted, q_rows, p_rows).items()


class LookupDrafter:
    """A deterministic proposer that, like an n-gram lookup, depends on the tokens so far only:
    it proposes the tokens that followed the last token's previous occurrence (or a fixed guess)."""

    def __call__(self, prefix: tuple[int, ...], length: int) -> tuple[int, ...]:
        if prefix and prefix[-1] in prefix[:-1]:
            start = prefix.index(prefix[-1]) + 1
            found = prefix[start : start + length]
        else:
            found = ()
        return (found + (1, 0, 2, 1) * length)[:length]


def choose_step(prefix: tuple[int, ...]) -> tuple[str, int]:
    """Source and draft length from the past only, varied enough to exercise every branch:
    plain target decodes, deterministic drafts, sampled drafts of several lengths, and sampled drafts
    a lookup takes over (how many model tokens; how far the lookup goes depends on what they were)."""
    code = (sum(prefix) * 7 + len(prefix) * 3) % 8
    return [("none", 0), ("lookup", 1), ("lookup", 3), ("model", 1), ("model", 2), ("lookup", 2),
            ("model+lookup", 1), ("model+lookup", 2)][code]


def taken_over(prefix: tuple[int, ...], drafted: tuple[int, ...]) -> tuple[int, ...]:
    """The lookup's continuation of a model's sampled tokens: its length, 1 or 2, depends on them."""
    return LookupDrafter()(prefix + drafted, 1 + drafted[-1] % 2)


def speculative_joint(target, draft_model, prefix: tuple[int, ...], length: int) -> dict[tuple[int, ...], float]:
    """Exact distribution of the next `length` tokens after `prefix` when every step picks its source
    and length with `choose_step` and runs the real verify rule (steps past `length` are cut)."""
    if len(prefix) >= length:
        return {prefix[:length]: 1.0}
    source, k = choose_step(prefix)
    k = min(k, length - len(prefix))
    outcomes: list[tuple[tuple[int, ...], float]] = []
    if source.startswith("model") and k:
        for drafted in np.ndindex(*(draft_model.vocab,) * k):
            q_rows = np.array([draft_model(prefix + drafted[:i]) for i in range(k)])
            drawn = np.prod(q_rows[np.arange(k), list(drafted)])
            proposed = drafted + (taken_over(prefix, drafted) if source == "model+lookup" else ())
            if drawn:
                outcomes += [(e, drawn * w) for e, w in enumerate_step(target, prefix, proposed, q_rows)]
    else:
        drafted = LookupDrafter()(prefix, k if source == "lookup" else 0)
        outcomes = list(enumerate_step(target, prefix, drafted, None))
    joint: dict[tuple[int, ...], float] = {}
    for emitted, weight in outcomes:
        for sequence, probability in speculative_joint(target, draft_model, prefix + emitted, length).items():
            joint[sequence] = joint.get(sequence, 0.0) + weight * probability
    return joint


CHOSEN_STEP_CASES = [(3, 4, 0), (3, 5, 1), (4, 4, 2)]  # (vocab, length, seed)


def assert_chosen_steps_are_exact(vocab: int, length: int, seed: int, sparsity: float) -> None:
    target = TinyLanguageModel(seed, vocab, sparsity)
    draft_model = TinyLanguageModel(seed + 100, vocab, sparsity)
    speculative = speculative_joint(target, draft_model, (), length)
    exact = dict(target_sequences(target, (), length))
    assert set(speculative) <= set(exact)
    for sequence, probability in exact.items():
        assert abs(speculative.get(sequence, 0.0) - probability) < 1e-12, sequence


@pytest.mark.parametrize("vocab, length, seed", CHOSEN_STEP_CASES)
@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_steps_with_source_and_length_chosen_from_the_past_are_exact(vocab, length, seed, sparsity) -> None:
    assert_chosen_steps_are_exact(vocab, length, seed, sparsity)


def without_token_floored(p: np.ndarray, token: int) -> np.ndarray:
    """p with `token` removed, plus 1e-3 on every token p allows: the right tokens, intervals off by ~1e-3."""
    residual = np.where(p > 0, p + 1e-3, 0.0)
    residual[token] = 0
    return residual / residual.sum()


def without_a_tenth_of_token(p: np.ndarray, token: int) -> np.ndarray:
    """p with `token` kept at a tenth of its mass: norm(max(0, p - 0.9 p(token) one-hot(token)))."""
    residual = p.copy()
    residual[token] *= 0.1
    return residual / residual.sum()


def on_a_dense_row(without):
    """A lookup's residual written on dense rows (a broken one), called as the rule calls it."""
    return lambda p, token: Distribution.on_support(without(p.dense(), token))


CONTROLS = {
    "lookup residual floored by 1e-3": ("without_token", on_a_dense_row(without_token_floored)),
    "lookup token kept at a tenth": ("without_token", on_a_dense_row(without_a_tenth_of_token)),
    "model residual floored by 1e-3": ("residual_distribution", on_dense_rows(residual_with_a_floor)),
}
# In two sparse cases every rejection of a model token that can happen has p > q on one token only: the
# floored residual is the right one there.
SAME_RESIDUAL = {("model residual floored by 1e-3", 3, 4, 0, 0.5), ("model residual floored by 1e-3", 3, 5, 1, 0.5)}


@pytest.mark.parametrize(
    "control, vocab, length, seed, sparsity",
    [
        (control, *case, sparsity)
        for control in CONTROLS for case in CHOSEN_STEP_CASES for sparsity in (0.0, 0.5)
        if (control, *case, sparsity) not in SAME_RESIDUAL
    ],
)
def test_the_enumeration_of_chosen_steps_detects_residuals_of_other_widths(
    control, vocab, length, seed, sparsity, monkeypatch
) -> None:
    """Negative controls: residuals of the right tokens (or nearly) with other widths, at a lookup's
    rejection or a draft model's, fail the multi-step enumeration in every case where they differ."""
    monkeypatch.setattr(verify_module, *CONTROLS[control])
    with pytest.raises(AssertionError):
        assert_chosen_steps_are_exact(vocab, length, seed, sparsity)
