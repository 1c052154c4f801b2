"""Statistical proof on real llama.cpp models: speculative sampling draws the target's distribution.

The exact joint distribution of the first two generated tokens is computed from the target's own
logits (one decode per first token); thousands of speculative generations are compared with it by
a chi-square test: with a draft model, with n-gram drafts (no q), with both under `--k auto`,
whose draft lengths change as it learns, and with model drafts the lookup takes over. Broken rules,
run the same way, must fail it: verification against the raw draft logits while drafting from
processed ones, resampling from p instead of the residual, and (n-gram, and a lookup taking a model's
draft over) resampling from p without removing the rejected token.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from speccli.llama.model import Model
from speccli.core.generator import Generator
from speccli.core.sampling import SamplingParams, distribution, probabilities
from speccli.core import verify as verify_module
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import Planner
from speccli.core.seam import Draft, Plan
from speccli.drafting.ngram import NgramLookup
from speccli.drafting.policy import FixedK
from speccli.drafting.specs import make_drafter
from tests.conftest import MemoryBoundAutoK, loaded_related_pair
from tests.token_distribution import chi_square_p_value
from tests.two_token_distribution import (
    exact_two_token_distribution,
    sampled_pairs,
    sampled_pairs_and_stats,
)

# Draws per test, from the controls' measured power (the neediest needs 1,900:
# tests/benchmarks/RESULTS.md, *Chi-square power*).
SAMPLES = 2000
PROMPT = b"the cat sat on"
# Temperature and top-k make processed and raw distributions differ, which a biased rule exposes.
SETTINGS = SamplingParams(temperature=0.7, top_k=12)


def repeating_prompt(target: Model) -> list[int]:
    """PROMPT, a token y, PROMPT again: n-gram lookup then proposes y first. y is the token whose
    probability there is closest to 1/2, so proposals are both kept and rejected (a random tiny
    model is peaked, and rarely copies its prompt on its own)."""
    base = target.tokenizer.tokenize(PROMPT)
    best_margin, best_prompt = 0.0, None
    for y in range(3, target.n_vocab):
        prompt = base + [y] + base[1:]
        target.reset()
        target.decode(prompt[:-1], n_logit_rows=0)
        p_y = float(probabilities(target.decode(prompt[-1:]), SETTINGS)[0][y])
        if min(p_y, 1 - p_y) > best_margin:
            best_margin, best_prompt = min(p_y, 1 - p_y), prompt
    target.reset()
    assert best_margin > 0.02, "every proposal would be kept, or every one rejected: pick another PROMPT"
    return best_prompt


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with loaded_related_pair(tmp_path_factory.mktemp("pair"), target_layers=4, draft_layers=2, eps=0.3) as pair:
        yield pair


class RawLogitsDraftBug(Planner):
    """The known bug: draft from processed q, but verify against softmax of the raw draft logits."""

    def draft(self, context, limit, sampling, rng, policy, constraint=None):
        draft = super().draft(context, limit, sampling, rng, policy)
        # Recompute q the buggy way: plain softmax over the raw logits, same prefixes.
        model = self.model.model
        model.truncate(len(context) - 1)
        raw = []
        for token in [context[-1]] + draft.tokens[:-1]:
            logits = model.decode([token])
            raw.append(distribution(logits[0], SamplingParams(temperature=1.0)))
        return replace(draft, q=raw)


def test_speculative_sampling_matches_the_target_distribution(pair) -> None:
    target, draft = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    for k in (1, 3):
        generator = Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(k), seed=1234 + k)
        p_value = chi_square_p_value(sampled_pairs(generator, prompt, SAMPLES, max_tokens=k + 1), expected)
        assert p_value > 1e-3, f"k={k}: p={p_value:.2e}"
        target.reset(), draft.reset()


def test_target_only_sampling_matches_too(pair) -> None:
    target, _ = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    p_value = chi_square_p_value(sampled_pairs(Generator(target, None, SETTINGS, seed=7), prompt, SAMPLES), expected)
    assert p_value > 1e-3, f"p={p_value:.2e}"
    target.reset()


def test_raw_draft_logits_bug_is_detected(pair) -> None:
    target, draft = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    generator = Generator(target, RawLogitsDraftBug(model=ModelDrafter(draft)), SETTINGS, FixedK(3), seed=99)
    p_value = chi_square_p_value(sampled_pairs(generator, prompt, SAMPLES), expected)
    target.reset(), draft.reset()
    assert p_value < 1e-6, f"the biased rule passed: p={p_value:.2e}"


def test_skipping_the_residual_is_detected(pair, monkeypatch) -> None:
    target, draft = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    # After a rejection, draw from p itself instead of norm(max(0, p - q)).
    monkeypatch.setattr(verify_module, "residual_distribution", lambda p, q: p)
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(3), seed=99)
    p_value = chi_square_p_value(sampled_pairs(generator, prompt, SAMPLES), expected)
    target.reset(), draft.reset()
    assert p_value < 1e-6, f"the biased rule passed: p={p_value:.2e}"


def test_ngram_drafts_match_the_target_distribution(pair) -> None:
    target, _ = pair
    prompt = repeating_prompt(target)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    generator = Generator(target, Planner(NgramLookup()), SETTINGS, FixedK(3), seed=21)
    pairs, stats = sampled_pairs_and_stats(generator, prompt, SAMPLES)
    target.reset()
    ngram = stats.by_source["ngram"]
    assert ngram.drafted_at[0] >= SAMPLES and 0 < ngram.accepted_at[0] < ngram.drafted_at[0], ngram  # kept and rejected
    p_value = chi_square_p_value(pairs, expected)
    assert p_value > 1e-3, f"p={p_value:.2e}"


def test_ngram_and_model_under_auto_k_match_the_target_distribution(pair) -> None:
    target, draft = pair
    prompt = repeating_prompt(target)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    policy = MemoryBoundAutoK()
    generator = Generator(target, make_drafter("ngram+model", draft, target), SETTINGS, policy, seed=22)
    pairs, stats = sampled_pairs_and_stats(generator, prompt, SAMPLES)
    target.reset(), draft.reset()
    lengths = stats.draft_lengths
    assert len([length for length in lengths if length > 0]) >= 2, f"auto should vary its draft length: {lengths}"
    assert set(stats.by_source) == {"ngram", "model"}, stats.by_source
    p_value = chi_square_p_value(pairs, expected)
    assert p_value > 1e-3, f"p={p_value:.2e}"


def prompt_the_lookup_continues(target: Model, draft: Model) -> list[int]:
    """PROMPT after every token the draft may sample at its end, each followed by the token the target
    likes best after it there: the lookup has no match at PROMPT's last token, but has one once the
    draft's first token is appended, so it takes the model's draft over, with tokens the target
    both keeps and rejects."""
    base = target.tokenizer.tokenize(PROMPT)
    follows: dict[int, int] = {}
    for _ in range(20):
        prompt = [token for candidate in sorted(follows) for token in (candidate, follows[candidate])] + base
        draft.reset()
        sampled_there = set(np.flatnonzero(probabilities(draft.decode(prompt), SETTINGS)[0] > 0).tolist())
        draft.reset()
        if follows and sampled_there <= set(follows):
            assert base[-1] not in prompt[:-1], "the lookup would match PROMPT's end: pick another PROMPT"
            return prompt
        for candidate in sampled_there | set(follows):
            target.reset()
            liked = int(target.decode(prompt + [candidate]).argmax())
            follows[candidate] = liked if liked != base[-1] else base[0]
        target.reset()
    raise AssertionError("the draft's next tokens keep changing with the prompt: pick another PROMPT")


class LookupFavouredK(FixedK):
    """K=3, with estimates that favour lookup drafts, so a chain lets the lookup take a model draft over
    wherever it has a match; counts the steps where it did."""

    def __init__(self) -> None:
        super().__init__(3)
        self.taken_over = 0

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        return Plan(min(self.k, available), 2.0 if key.startswith("ngram") else 1.0)

    def observe(self, draft: Draft, step, yielded) -> None:
        self.taken_over += draft.continuation is not None


def test_model_drafts_a_lookup_takes_over_match_the_target_distribution(pair) -> None:
    target, draft = pair
    prompt = prompt_the_lookup_continues(target, draft)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    policy = LookupFavouredK()
    generator = Generator(target, make_drafter("ngram+model", draft, target), SETTINGS, policy, seed=24)
    pairs, stats = sampled_pairs_and_stats(generator, prompt, SAMPLES)
    target.reset(), draft.reset()
    assert policy.taken_over >= SAMPLES, f"the lookup should take over every first draft: {policy.taken_over}"
    ngram = stats.by_source["ngram"]
    assert 0 < ngram.accepted < ngram.judged, ngram  # its tokens were both kept and rejected
    p_value = chi_square_p_value(pairs, expected)
    assert p_value > 1e-3, f"p={p_value:.2e}"


def test_a_taken_over_draft_verified_without_removing_a_rejected_lookup_token_is_detected(pair, monkeypatch) -> None:
    target, draft = pair
    prompt = prompt_the_lookup_continues(target, draft)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    monkeypatch.setattr(verify_module, "without_token", lambda p, token: p)
    generator = Generator(target, make_drafter("ngram+model", draft, target), SETTINGS, LookupFavouredK(), seed=25)
    p_value = chi_square_p_value(sampled_pairs(generator, prompt, SAMPLES), expected)
    target.reset(), draft.reset()
    assert p_value < 1e-6, f"the biased rule passed: p={p_value:.2e}"


def test_ngram_resampling_that_keeps_the_rejected_token_is_detected(pair, monkeypatch) -> None:
    target, _ = pair
    prompt = repeating_prompt(target)
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    monkeypatch.setattr(verify_module, "without_token", lambda p, token: p)
    generator = Generator(target, Planner(NgramLookup()), SETTINGS, FixedK(3), seed=23)
    p_value = chi_square_p_value(sampled_pairs(generator, prompt, SAMPLES), expected)
    target.reset()
    assert p_value < 1e-6, f"the biased rule passed: p={p_value:.2e}"
