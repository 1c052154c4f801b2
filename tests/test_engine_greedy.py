"""Greedy speculative output equals the target's own greedy output: on tiny test models and on the
real Gemma pair, 20 prompts each. Where they part, the test requires the target's top-two gap there
to be within llama.cpp's batched-vs-single logit difference for that model, and reports it."""
from __future__ import annotations

import warnings

import pytest

from speccli.llama.model import LoadOptions, Model
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.stats import Source, TokenEvent
from speccli.core.parting import find_parting
from speccli.core.sampling import SamplingParams
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import Planner
from speccli.drafting.policy import AutoK, FixedK
from speccli.drafting.specs import make_drafter
from tests.conftest import MemoryBoundAutoK, loaded_related_pair

GREEDY = SamplingParams(temperature=0)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    '{"name": "Ada", "age":',
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "The quick brown fox",
    "Water boils at",
    "import numpy as np\n\n",
    "Dear Sir or Madam,\n\nI am writing to",
    "Q: What is the largest planet?\nA:",
    "SELECT name FROM users WHERE",
    "The theory of relativity states that",
    "<html>\n<head>\n<title>",
    "In 1969, astronauts",
    "Ingredients:\n- 2 eggs\n-",
    "for i in range(10):\n    ",
    "The French word for cat is",
    "Summary: The meeting discussed",
    "Roses are red,\nViolets are blue,\n",
    "#include <stdio.h>\n\nint main() {\n",
]


def greedy_tokens(generator: Generator, prompt: list[int], max_tokens: int):
    generator.reset()
    events = list(generator.generate(prompt, GenerationLimits(max_tokens=max_tokens)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    return [e.token for e in tokens], [e.source for e in tokens], events[-1].stats


_REFERENCES: dict[tuple, tuple[list[int], bool]] = {}


def reference_tokens(target: Model, prompt: list[int], max_tokens: int) -> list[int]:
    """The target alone's greedy reply, made once per file, settings and prompt for the whole run: from an
    empty cache, one token a decode, it is the same each time, so the tests that compare with it share it
    (the longest asked for, cut to each length: a shorter run is its prefix)."""
    key = (target.path, target.n_batch, target.options.n_threads, tuple(prompt))
    tokens, ended = _REFERENCES.get(key, ([], False))
    if len(tokens) < max_tokens and not ended:
        tokens = greedy_tokens(Generator(target, None, GREEDY), prompt, max_tokens)[0]
        _REFERENCES[key] = tokens, len(tokens) < max_tokens  # shorter: the reply ended there
    return tokens[:max_tokens]


def check_greedy_equality(
    target: Model, drafter, policy, max_tokens: int, min_draft_share: float, prompts=PROMPTS
) -> list[str]:
    """Assert equality or a near-tie parting for every prompt, and that drafts really were used
    (their share of all emitted tokens is at least `min_draft_share`); return the partings seen."""
    partings = []
    drafted_tokens = all_tokens = 0
    speculative_generator = Generator(target, drafter, GREEDY, policy)
    for text in prompts:
        prompt = target.tokenizer.tokenize(text)
        reference = reference_tokens(target, prompt, max_tokens)
        speculative, sources, stats = greedy_tokens(speculative_generator, prompt, max_tokens)
        drafted_tokens += sources.count(Source.DRAFT)
        all_tokens += len(sources)
        # Tolerance is measured at the widest verify batch this run used.
        widest = max(stats.draft_lengths, default=0)
        parting = find_parting(target, prompt, reference, speculative, max(widest, 1))
        if parting is None:
            # Equal as far as both go; they may only stop at different points if one hit the end.
            assert len(reference) == len(speculative) == max_tokens or reference == speculative, text
            continue
        assert parting.near_tie, f"{text!r}: {parting.describe()}"
        partings.append(f"{text!r}: {parting.describe()}")
    assert drafted_tokens >= min_draft_share * all_tokens, f"only {drafted_tokens} of {all_tokens} tokens came from drafts"
    for line in partings:
        warnings.warn(line)
    return partings


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    with loaded_related_pair(tmp_path_factory.mktemp("greedy"), target_layers=6, draft_layers=2, eps=0.1) as pair:
        yield pair


@pytest.mark.parametrize("k", [1, 4, 9])
def test_tiny_pair_greedy_equals_target_alone(tiny_pair, k: int) -> None:
    target, draft = tiny_pair
    check_greedy_equality(target, Planner(model=ModelDrafter(draft)), FixedK(k), max_tokens=40, min_draft_share=0.3)


REPEATING_PROMPTS = [text * 3 for text in PROMPTS]  # input the reply can copy: n-gram lookup finds it


@pytest.mark.parametrize("spec", ["ngram", "ngram+model"])
@pytest.mark.parametrize("k", ["auto", "6"])
def test_tiny_pair_greedy_equals_target_alone_with_ngram_drafts(tiny_pair, spec: str, k: str) -> None:
    target, draft = tiny_pair
    policy = MemoryBoundAutoK() if k == "auto" else FixedK(int(k))
    # Random tiny models seldom copy their prompt, so few n-gram drafts are kept: some must be.
    check_greedy_equality(target, make_drafter(spec, draft, target), policy, max_tokens=40, min_draft_share=0.01, prompts=REPEATING_PROMPTS)


def test_tiny_pair_greedy_equals_target_alone_with_auto_k(tiny_pair) -> None:
    target, draft = tiny_pair
    check_greedy_equality(target, Planner(model=ModelDrafter(draft)), MemoryBoundAutoK(), max_tokens=40, min_draft_share=0.3)


def test_draft_equal_to_target_accepts_everything(tiny_pair) -> None:
    target, _ = tiny_pair
    with Model(target.path, LoadOptions(n_ctx=256, n_threads=1)) as same:
        generator = Generator(target, Planner(model=ModelDrafter(same)), GREEDY, FixedK(4))
        prompt = target.tokenizer.tokenize(PROMPTS[0])
        stats = [e for e in generator.generate(prompt, GenerationLimits(max_tokens=60))][-1].stats
    assert stats.acceptance_rate >= 0.98, stats


@pytest.mark.gemma
def test_gemma_pair_greedy_equals_target_alone(gemma_pair) -> None:
    """8 of the prompts (20 cost CI two minutes): tests/test_greedy_reference.py checks the same drafts
    against llama-cpp-python's own generation, an independent path."""
    target, draft = gemma_pair
    check_greedy_equality(target, Planner(model=ModelDrafter(draft)), FixedK(4), max_tokens=24, min_draft_share=0.5, prompts=PROMPTS[:8])


@pytest.mark.gemma
def test_gemma_greedy_equals_target_alone_with_ngram_and_auto_k(gemma_pair) -> None:
    target, draft = gemma_pair
    check_greedy_equality(
        target, make_drafter("ngram+model", draft, target), AutoK(), max_tokens=24, min_draft_share=0.5, prompts=REPEATING_PROMPTS[:6]
    )


@pytest.mark.gemma
def test_gemma_draft_equal_to_target_accepts_nearly_everything(gemma_pair) -> None:
    target, _ = gemma_pair
    with Model(target.path, LoadOptions(n_ctx=512)) as same:
        generator = Generator(target, Planner(model=ModelDrafter(same)), GREEDY, FixedK(4))
        prompt = target.tokenizer.tokenize(PROMPTS[1])
        stats = [e for e in generator.generate(prompt, GenerationLimits(max_tokens=48))][-1].stats
    # F32 batched and single-token logits differ by at most ~0.04, so only exact near-ties can reject.
    assert stats.acceptance_rate >= 0.95, stats


def test_the_tolerance_is_measured_with_each_row_at_each_place_in_its_batch(tiny_pair) -> None:
    import numpy as np

    from speccli.core import parting

    target, _ = tiny_pair
    prompt, positions = [1, 5, 9], list(range(20, 31))
    single = parting._logit_rows(target, prompt, positions, rows_per_decode=1)
    for offset in range(parting.ALIGNMENTS):
        batched = parting._logit_rows(target, prompt, positions, rows_per_decode=4, offset=offset)
        assert batched.shape == single.shape
        np.testing.assert_allclose(batched, single, atol=0.05)  # each row its own position's, in order
