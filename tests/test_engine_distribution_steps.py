"""Statistical proof on real llama.cpp models, over several steps: the first three generated tokens (not
only two), with the production `auto` policy choosing each step's length and source from the past, at
K > 1 with its bonus token, and under top-p and min-p, against the target alone's exact distribution
(tests/token_distribution.py: the target's tree, one decode per prefix).

Each passing test has negative controls here, run the same way, that must fail it with p < 1e-6: what
choosing K per step could break (a length chosen by peeking at the target's verdict, a cache that keeps
rejected drafts' entries, the draft's sampling uniforms reused to accept), a bonus drawn from the row
before its own, and a draft reporting unfiltered q while sampling the filtered one.

The policy and drafters are touched through their constructors and `Generator` only; the broken
engines are monkeypatches of module-level names (`verify_sampled` as the generator calls it, `Model.
truncate` of the target, the `distribution` and `sample` the draft model drafts with) and of the generator's rng.
"""
from __future__ import annotations


from collections import defaultdict
from typing import Callable

import llama_cpp
import numpy as np
import pytest

import speccli.drafting.model as model_drafting
from speccli.core import generator as generator_module
from speccli.core.generator import Generator
from speccli.core.sampling import Distribution, SamplingParams, distribution, sample
from speccli.core.stats import RunStats
from speccli.core.verify import verify_sampled
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import Planner
from speccli.drafting.policy import FixedK
from speccli.drafting.specs import make_drafter
from speccli.llama.model import Model
from tests.conftest import MemoryBoundAutoK, loaded_related_pair
from tests.test_engine_distribution import repeating_prompt
from tests.token_distribution import (
    Generation,
    chi_square_p_value,
    exact_distribution,
    grouped_chi_square_p_value,
    next_token_row,
    sample_generations,
)

# Draws per test, from the controls' measured power (tests/benchmarks/RESULTS.md, *Chi-square power*):
# at K = 2 one control needs 2,200.
SAMPLES = 2000
K2_SAMPLES = 2400
LENGTH = 3  # generated tokens compared
SETTINGS = SamplingParams(temperature=0.7, top_k=12)  # as tests/test_engine_distribution.py
PROMPT = b"hello world"  # a first token neither sure nor flat on this pair (top probability 0.39)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with loaded_related_pair(tmp_path_factory.mktemp("pair"), target_layers=4, draft_layers=2, eps=0.3) as pair:
        yield pair


def generate(
    generator: Generator, prompt: list[int], max_tokens: int, fresh: bool = False, samples: int = SAMPLES
) -> tuple[list[Generation], RunStats | None]:
    """`samples` generations (each from an empty cache where `fresh`, then without statistics), the
    caches emptied after."""
    if fresh:
        generations = []
        for _ in range(samples):
            generator.reset()
            generations += sample_generations(generator, prompt, 1, max_tokens)[0]
        stats = None
    else:
        generations, stats = sample_generations(generator, prompt, samples, max_tokens)
    generator.reset()
    return generations, stats


def first_tokens_p_value(generations: list[Generation], expected: dict) -> float:
    return chi_square_p_value([generation.first(LENGTH) for generation in generations], expected)


# ---- Broken engines ------------------------------------------------------------------------------


def cut_before_a_token_the_target_likes_less(drafted, q, p, rng):
    """Peeks: the draft is cut before its first model token x with p(x) < q(x), as a K policy or a
    draft that stops where the target would reject would cut it. (Its verify rows stay unread.)"""
    drawn = 0 if q is None else len(q)
    for i in range(drawn):
        if p[i][drafted[i]] < q[i][drafted[i]]:
            return verify_sampled(drafted[:i], q[:i], p, rng)
    return verify_sampled(drafted, q, p, rng)


def drop_the_last_token_if_the_target_likes_it_less(drafted, q, p, rng):
    """Peeks: a draft model's last token x is dropped where p(x) < q(x)."""
    k, drawn = len(drafted), 0 if q is None else len(q)
    if k and drawn == k and p[k - 1][drafted[-1]] < q[k - 1][drafted[-1]]:
        return verify_sampled(drafted[:-1], q[:-1], p, rng)
    return verify_sampled(drafted, q, p, rng)


def truncate_keeping_the_rejected_entries(model: Model) -> Callable[[int], None]:
    """A truncate that moves n_past back but leaves the rejected drafts' KV entries in the cache. llama.cpp
    refuses a batch that does not start right after the cache's last position, so the entries cannot
    stay where they were; they are moved down to the positions just before n_past (llama_memory_seq_add),
    where every later token attends them, as it would stale entries left in place."""

    def truncate(n_tokens: int) -> None:
        if n_tokens < model.n_past:
            llama_cpp.llama_memory_seq_add(model._memory, 0, n_tokens, -1, n_tokens - model.n_past)
            model.n_past = n_tokens

    return truncate


class DraftUniformsReused:
    """Stands in for the generator's rng: a step's acceptance uniforms are the ones its draft model
    sampled its tokens with (one uniform per token, by inverse CDF), instead of fresh ones."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.recent = rng, []

    def random(self, size: int | None = None):
        if size is None:
            self.recent.append(self.rng.random())
            return self.recent[-1]
        reused = [*self.rng.random(size), *self.recent][-size:]
        self.recent = []
        return np.array(reused)


class BonusFromTheRowBefore:
    """Verify rows whose bonus row (row k) is row k - 1: the bonus drawn off by one position."""

    def __init__(self, p, k: int) -> None:
        self.p, self.k = p, k

    def __len__(self) -> int:
        return len(self.p)

    def __getitem__(self, index: int):
        return self.p[self.k - 1] if index == self.k else self.p[index]


def bonus_from_the_row_before(drafted, q, p, rng):
    return verify_sampled(drafted, q, BonusFromTheRowBefore(p, len(drafted)) if len(drafted) else p, rng)


class ReportedUnfiltered(Distribution):
    """The unfiltered distribution a broken draft reports as q, carrying the filtered one it draws from."""

    __slots__ = ("drawn",)


def unfiltered_q_reported(ids, logits, params, vocab, out=None):
    """The draft model samples from the filtered q (`drawn_from_the_filtered`), but the q it reports is
    the softmax at the temperature alone, without top-k, top-p or min-p (no grammar here: `ids` None)."""
    assert ids is None
    reported = distribution(logits, SamplingParams(temperature=params.temperature), out=out)
    unfiltered = ReportedUnfiltered(reported.ids, reported.weights, reported.size)
    unfiltered.drawn = distribution(logits, params)
    return unfiltered


def drawn_from_the_filtered(q, rng) -> int:
    return sample(q.drawn, rng)


# ---- K per step with the production policy and real sources ---------------------------------------


@pytest.fixture(scope="module")
def copying(pair):
    """A prompt whose end the lookup finds earlier in it, and the target's exact first three tokens there."""
    target, _ = pair
    prompt = repeating_prompt(target)
    return prompt, exact_distribution(target, prompt, SETTINGS, LENGTH)


def steps_for_the_first(generation: Generation, length: int) -> int:
    tokens = steps = 0
    for _, given in generation.steps:
        if tokens >= length:
            break
        tokens, steps = tokens + len(given), steps + 1
    return steps


@pytest.mark.parametrize("spec", ["ngram+model", "model", "ngram"])
def test_auto_k_over_real_sources_gives_the_targets_first_three_tokens(pair, copying, spec) -> None:
    """`auto` (the production policy, at pretended GPU-like costs) chooses every step's length, and the
    chain its source, from what earlier steps and replies yielded; a reply may draft past the three
    tokens compared (up to 6), and most take two or three steps to make them."""
    target, draft = pair
    prompt, expected = copying
    generator = Generator(target, make_drafter(spec, draft, target), SETTINGS, MemoryBoundAutoK(), seed=5)
    generations, stats = generate(generator, prompt, max_tokens=6)
    lengths = {length for length, steps in stats.draft_lengths.items() if length and steps >= 20}
    assert len(lengths) >= 2, f"auto should vary its draft length: {stats.draft_lengths}"
    assert set(stats.by_source) == set(spec.split("+")), stats.by_source
    several_steps = sum(steps_for_the_first(generation, LENGTH) >= 2 for generation in generations)
    assert several_steps >= SAMPLES / 2, f"only {several_steps} replies took more than one step for {LENGTH} tokens"
    p_value = first_tokens_p_value(generations, expected)
    assert p_value > 1e-3, f"p={p_value:.2e}"


def test_auto_k_with_a_length_cut_where_the_target_would_reject_is_detected(pair, copying) -> None:
    """Negative control: the draft model under `auto`, its drafts cut before the first token the target
    likes less than the draft (a choice of length that peeks at the target). The model alone, whose
    choices here do not depend on the clock: the chain weighs its sources by the seconds their steps
    took, and on a loaded machine it passed the model over often enough to leave too few model drafts
    for the control to fail."""
    target, draft = pair
    prompt, expected = copying
    generator = Generator(target, make_drafter("model", draft, target), SETTINGS, MemoryBoundAutoK(), seed=5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generator_module, "verify_sampled", cut_before_a_token_the_target_likes_less)
        generations, _ = generate(generator, prompt, max_tokens=6)
    p_value = first_tokens_p_value(generations, expected)
    assert p_value < 1e-6, f"the peeking length passed: p={p_value:.2e}"


# ---- Model drafts at K = 2: three tokens, tokens 2-3 after a fixed first one; what K per step could break


@pytest.fixture(scope="module")
def plain(pair):
    """PROMPT, the target's exact first three tokens after it, and its most likely first token."""
    target, _ = pair
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_distribution(target, prompt, SETTINGS, LENGTH)
    first: dict[int, float] = defaultdict(float)
    for sequence, probability in expected.items():
        first[sequence[0]] += probability
    return prompt, expected, max(first, key=first.get)


def after_the_first(token: int, generations: list[Generation], expected: dict) -> tuple[list, dict]:
    """Tokens 2-3 of the generations whose first token is `token`, and their exact distribution there."""
    total = sum(probability for sequence, probability in expected.items() if sequence[0] == token)
    conditional = {sequence[1:]: probability / total for sequence, probability in expected.items() if sequence[0] == token}
    return [generation.first(LENGTH)[1:] for generation in generations if generation.tokens[0] == token], conditional


@pytest.fixture(scope="module")
def k2_model_drafts(pair, plain):
    target, draft = pair
    prompt, _, _ = plain
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(2), seed=5)
    return generate(generator, prompt, max_tokens=LENGTH, samples=K2_SAMPLES)[0]


def test_model_drafts_at_k2_give_the_targets_first_three_tokens(plain, k2_model_drafts) -> None:
    _, expected, _ = plain
    p_value = first_tokens_p_value(k2_model_drafts, expected)
    assert p_value > 1e-3, f"p={p_value:.2e}"


def test_tokens_two_and_three_after_a_fixed_first_token_are_the_targets(plain, k2_model_drafts) -> None:
    """Conditioned on the first token (the target's most likely), tokens 2-3: made by the same step's
    later positions (its rows 1 and 2, the bonus) or by a step after a rejection, from a cache cut back."""
    _, expected, first = plain
    observed, conditional = after_the_first(first, k2_model_drafts, expected)
    assert len(observed) >= SAMPLES / 4, len(observed)
    p_value = chi_square_p_value(observed, conditional)
    assert p_value > 1e-3, f"p={p_value:.2e}"


K2_CONTROLS = ["a last token dropped where p < q", "rejected entries kept in the cache", "draft uniforms reused"]


@pytest.fixture(scope="module")
def k2_broken(pair, plain):
    """Generations of each broken engine of K2_CONTROLS, at K = 2 on PROMPT, made once for the tests below."""
    target, draft = pair
    prompt, _, _ = plain
    made = {}

    def generations(control: str) -> list[Generation]:
        if control not in made:
            generator = Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(2), seed=5)
            with pytest.MonkeyPatch.context() as patch:
                if control == K2_CONTROLS[0]:
                    patch.setattr(generator_module, "verify_sampled", drop_the_last_token_if_the_target_likes_it_less)
                elif control == K2_CONTROLS[1]:
                    patch.setattr(target, "truncate", truncate_keeping_the_rejected_entries(target))
                else:
                    generator.rng = DraftUniformsReused(generator.rng)
                # Stale entries would pile up from one reply into the next's prompt: each starts empty.
                fresh = control == K2_CONTROLS[1]
                made[control] = generate(generator, prompt, LENGTH, fresh=fresh, samples=K2_SAMPLES)[0]
        return made[control]

    return generations


@pytest.mark.parametrize("control", K2_CONTROLS)
def test_what_k_per_step_could_break_is_detected_in_the_first_three_tokens(plain, k2_broken, control) -> None:
    """Negative controls for the two tests above, first: a draft whose last token is dropped where the
    target likes it less (a length that peeks), a truncate that leaves rejected drafts' entries in the
    target's cache, and the draft's sampling uniforms reused as its acceptance uniforms."""
    _, expected, _ = plain
    p_value = first_tokens_p_value(k2_broken(control), expected)
    assert p_value < 1e-6, f"{control}: p={p_value:.2e}"


def test_stale_cache_entries_are_detected_in_tokens_two_and_three(plain, k2_broken) -> None:
    """Negative control for tokens 2-3 after a fixed first token: rejected entries kept in the cache
    (what a first-step rejection leaves behind changes the later tokens, not the first)."""
    _, expected, first = plain
    p_value = chi_square_p_value(*after_the_first(first, k2_broken(K2_CONTROLS[1]), expected))
    assert p_value < 1e-6, f"p={p_value:.2e}"


# ---- The bonus token at K = 3 ---------------------------------------------------------------------


def bonus_p_value(target: Model, prompt: list[int], generations: list[Generation]) -> float:
    """Every bonus drawn after 2 or more kept drafts, grouped by the tokens before it (groups of at
    least 20), each group against the target's row after its prefix."""
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for generation in generations:
        for before, token in generation.bonuses(at_least=2):
            groups[before].append(token)
    large = {before: tokens for before, tokens in groups.items() if len(tokens) >= 20}
    assert sum(map(len, large.values())) >= SAMPLES / 5, f"too few bonus tokens: {sum(map(len, groups.values()))}"
    return grouped_chi_square_p_value(
        [(tokens, next_token_row(target, prompt + list(before), SETTINGS)) for before, tokens in large.items()]
    )


@pytest.mark.parametrize("broken", [False, True], ids=["correct", "bonus from the row before"])
def test_the_bonus_after_three_kept_drafts_is_the_targets(pair, plain, broken) -> None:
    """The token after 3 kept drafts is drawn from the target's row 3 for that prefix (the 4th token:
    one step, K = 3); the negative control draws it from row 2."""
    target, draft = pair
    prompt, _, _ = plain
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(3), seed=6)
    with pytest.MonkeyPatch.context() as patch:
        if broken:
            patch.setattr(generator_module, "verify_sampled", bonus_from_the_row_before)
        generations, _ = generate(generator, prompt, max_tokens=4)
    p_value = bonus_p_value(target, prompt, generations)
    if broken:
        assert p_value < 1e-6, f"the bonus from the row before passed: p={p_value:.2e}"
    else:
        assert p_value > 1e-3, f"p={p_value:.2e}"


# ---- Top-p and min-p ------------------------------------------------------------------------------

FILTERS = {
    "top-p 0.6": SamplingParams(temperature=0.8, top_p=0.6),
    "min-p 0.1 within top-p 0.7": SamplingParams(temperature=0.8, top_p=0.7, min_p=0.1),
}


@pytest.mark.parametrize("broken", [False, True], ids=["correct", "unfiltered q reported"])
@pytest.mark.parametrize("filters", FILTERS)
def test_top_p_and_min_p_under_auto_give_the_targets_first_three_tokens(pair, filters, broken) -> None:
    """The chain under `auto` with top-p (and min-p): the first three tokens are the filtered target's.
    The negative control's draft model samples from its filtered q but reports the unfiltered one."""
    target, draft = pair
    sampling = FILTERS[filters]
    prompt = target.tokenizer.tokenize(PROMPT)
    expected = exact_distribution(target, prompt, sampling, LENGTH)
    generator = Generator(target, make_drafter("ngram+model", draft, target), sampling, MemoryBoundAutoK(), seed=11)
    with pytest.MonkeyPatch.context() as patch:
        if broken:
            patch.setattr(model_drafting, "distribution_among", unfiltered_q_reported)
            patch.setattr(model_drafting, "sample", drawn_from_the_filtered)
        generations, _ = generate(generator, prompt, max_tokens=6)
    p_value = first_tokens_p_value(generations, expected)
    if broken:
        assert p_value < 1e-6, f"the unfiltered q passed: p={p_value:.2e}"
    else:
        assert p_value > 1e-3, f"p={p_value:.2e}"
