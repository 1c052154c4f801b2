"""Statistical proof on real llama.cpp models: speculative sampling draws the target's distribution.

The exact joint distribution of the first two generated tokens is computed from the target's own
logits (one decode per first token); thousands of speculative generations are compared with it by
a chi-square test. Two broken rules, run the same way, must fail it: verification against the raw
draft logits while drafting from processed ones, and resampling from p instead of the residual.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from speccli.llama.model import Model
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.stats import TokenEvent
from speccli.core.sampling import SamplingParams, probabilities
from speccli.core import verify as verify_module
from speccli.drafting.model import ModelDrafter
from speccli.drafting.policy import FixedK
from tests.conftest import loaded_related_pair

SAMPLES = 3000
PROMPT = b"the cat sat on"
# Temperature and top-k make processed and raw distributions differ, which a biased rule exposes.
SETTINGS = SamplingParams(temperature=0.7, top_k=12)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with loaded_related_pair(tmp_path_factory.mktemp("pair"), target_layers=4, draft_layers=2, eps=0.3) as pair:
        yield pair


def exact_two_token_distribution(target: Model, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """P(first two tokens) under the target alone; a sequence that ends first is one token long."""
    target.reset()
    target.decode(prompt[:-1], n_logit_rows=0)
    first = probabilities(target.decode(prompt[-1:]), SETTINGS)[0]
    joint = {}
    for token in np.flatnonzero(first > 0):
        if target.tokenizer.is_end_of_generation(int(token)):
            joint[(int(token),)] = float(first[token])  # generation ends there
            continue
        target.truncate(len(prompt))
        second = probabilities(target.decode([int(token)]), SETTINGS)[0]
        for following in np.flatnonzero(second > 0):
            joint[(int(token), int(following))] = float(first[token] * second[following])
    target.reset()
    return joint


def sampled_pairs(generator: Generator, prompt: list[int], n: int) -> list[tuple[int, ...]]:
    """The first two tokens of n generations; the end-of-generation token is kept when it comes first.

    Each generation asks for k+1 tokens, so its first step drafts all k (the engine drafts no more
    than a reply still needs) and the whole verify rule, bonus token included, shapes the pair.
    """
    pairs = []
    for _ in range(n):
        events = list(generator.generate(prompt, GenerationLimits(max_tokens=max(2, generator.k + 1))))
        tokens = [e.token for e in events if isinstance(e, TokenEvent)][:2]
        if len(tokens) < 2 and events[-1].reason == "eog":
            tokens.append(generator.tokens[len(prompt) + len(tokens)])
        pairs.append(tuple(tokens))
    return pairs


def chi_square_p_value(observed: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> float:
    """Cells expected >= 5 times are tested one by one; the rest are lumped into one cell."""
    counts: dict[tuple[int, ...], int] = {}
    for pair_of_tokens in observed:
        counts[pair_of_tokens] = counts.get(pair_of_tokens, 0) + 1
    assert set(counts) <= set(expected), "a pair the target gives probability 0"
    big = [cell for cell, probability in expected.items() if probability * len(observed) >= 5]
    observed_counts = [counts.get(cell, 0) for cell in big]
    expected_counts = [expected[cell] * len(observed) for cell in big]
    observed_counts.append(len(observed) - sum(observed_counts))
    expected_counts.append(len(observed) - sum(expected_counts))
    return float(stats.chisquare(observed_counts, expected_counts).pvalue)


class RawLogitsDraftBug(Generator):
    """The known bug: draft from processed q, but verify against softmax of the raw draft logits."""

    def _draft(self, k):
        drafted, processed_q, seconds = super()._draft(k)
        # Recompute q the buggy way: plain softmax over the raw logits, same prefixes.
        self.draft.truncate(len(self.tokens) - 1)
        raw = []
        for token in [self.tokens[-1]] + drafted[:-1]:
            logits = self.draft.decode([token])
            raw.append(probabilities(logits, SamplingParams(temperature=1.0))[0])
        return drafted, np.stack(raw), seconds


def test_speculative_sampling_matches_the_target_distribution(pair) -> None:
    target, draft = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_two_token_distribution(target, prompt)
    for k in (1, 3):
        generator = Generator(target, draft, SETTINGS, k=k, seed=1234 + k)
        p_value = chi_square_p_value(sampled_pairs(generator, prompt, SAMPLES), expected)
        assert p_value > 1e-3, f"k={k}: p={p_value:.2e}"
        target.reset(), draft.reset()


def test_target_only_sampling_matches_too(pair) -> None:
    target, _ = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_two_token_distribution(target, prompt)
    p_value = chi_square_p_value(sampled_pairs(Generator(target, None, SETTINGS, k=0, seed=7), prompt, SAMPLES), expected)
    assert p_value > 1e-3, f"p={p_value:.2e}"
    target.reset()


def test_raw_draft_logits_bug_is_detected(pair) -> None:
    target, draft = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_two_token_distribution(target, prompt)
    generator = RawLogitsDraftBug(target, draft, SETTINGS, k=3, seed=99)
    p_value = chi_square_p_value(sampled_pairs(generator, prompt, SAMPLES), expected)
    target.reset(), draft.reset()
    assert p_value < 1e-6, f"the biased rule passed: p={p_value:.2e}"


def test_skipping_the_residual_is_detected(pair, monkeypatch) -> None:
    target, draft = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_two_token_distribution(target, prompt)
    # After a rejection, draw from p itself instead of norm(max(0, p - q)).
    monkeypatch.setattr(verify_module, "residual_distribution", lambda p, q: p / p.sum())
    generator = Generator(target, draft, SETTINGS, k=3, seed=99)
    p_value = chi_square_p_value(sampled_pairs(generator, prompt, SAMPLES), expected)
    target.reset(), draft.reset()
    assert p_value < 1e-6, f"the biased rule passed: p={p_value:.2e}"
