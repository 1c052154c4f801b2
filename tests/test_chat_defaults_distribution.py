"""At chat's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), on real models: the first token
of speculative generations follows the target's distribution as computed independently, from
llama-cpp-python's own evaluation of the prompt (its high-level `Llama`) put through the filters' dense
definition (tests/test_sparse_sampling.py), not through the engine's sparse sampling.

Two pairs: the bundled Gemma pair (F32 target, its own Q4_K_M draft), and the Gemma target with the
Qwen2.5-Coder 0.5B draft, another vocabulary, drafting shared tokens with their q (TLI). Each draft token
is verified by the real rule against the target's batched row; the F32 target's batched and single-token
logits differ by far less than the filters' margins here (asserted, so a prompt near a filter's edge is
named rather than failing at random).

Negative controls, run the same way: a top-k floor taken too high (the sparse path keeps too few
tokens), and shared tokens reported as q without their renormalisation (the draft's q too small, so its
tokens are kept too often).
"""
from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from speccli.bench.prompts import load_prompt_set
from speccli.core import sampling as sampling_module
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.core.stats import StepEvent, TokenEvent
from speccli.drafting import translated as translated_module
from speccli.drafting.policy import FixedK
from speccli.drafting.specs import make_drafter
from speccli.llama.model import LoadOptions, Model
from tests.test_sparse_sampling import reference_row
from tests.token_distribution import chi_square_p_value

CHAT = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
# The built-in summarize prompt: 5 tokens survive the filters, the top one at 0.75, every edge at least 0.01
# (in logits) or 0.001 (in top-p's mass) away; the story prompt has a token 0.0009 from min-p's edge.
PROMPT = next(prompt.prompt for prompt in load_prompt_set(None).prompts if prompt.task == "summarize").encode()
# Draws, from the controls' measured power (tests/benchmarks/RESULTS.md, *Chi-square power*): the top-k
# control needs about 180, the unnormalised shared tokens about 470, their engine tests 120 and 290.
GEMMA_SAMPLES = 200
CROSS_SAMPLES = 300
CROSS_CONTROL_SAMPLES = 480


@pytest.fixture(scope="module")
def expected(gemma_pair):
    """The target alone's first-token distribution after PROMPT, from llama-cpp-python's own evaluation."""
    target, _ = gemma_pair
    prompt = target.tokenizer.tokenize(PROMPT)
    llama = llama_cpp.Llama(str(target.path), n_ctx=512, n_batch=64, verbose=False)
    try:
        llama.eval(prompt)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(llama.n_vocab(),)).copy()
    finally:
        llama.close()
    assert_far_from_the_filters_edges(logits)
    row = reference_row(logits, CHAT)
    return prompt, {(int(token),): float(row[token]) for token in np.flatnonzero(row > 0)}


def assert_far_from_the_filters_edges(logits: np.ndarray, margin: float = 0.01) -> None:
    """No token within `margin` (in logits) of where top-k or min-p would keep or drop it, nor top-p's mass
    within `margin` of its threshold at the last token it keeps."""
    ordered = np.sort(logits)[::-1].astype(np.float64)
    top_k_gap = ordered[CHAT.top_k - 1] - ordered[CHAT.top_k]
    min_logit = ordered[0] + np.log(CHAT.min_p)
    untempered = np.exp(ordered[: CHAT.top_k] - ordered[0])
    mass = np.cumsum(untempered) / untempered.sum()
    assert top_k_gap > margin and np.abs(ordered - min_logit).min() > margin, "the prompt sits at a filter's edge"
    assert np.abs(mass - CHAT.top_p).min() > margin / 10, "the prompt sits at top-p's edge"


def first_tokens(target: Model, drafter, samples: int) -> tuple[list[tuple[int, ...]], int]:
    """The first token of `samples` generations, each made by a step that verified one draft token (the
    generation is left there), and how many of those drafts were kept."""
    prompt = target.tokenizer.tokenize(PROMPT)
    generator = Generator(target, drafter, CHAT, FixedK(1), seed=3)
    firsts, kept = [], 0
    for _ in range(samples):
        for event in generator.generate(prompt, GenerationLimits(max_tokens=2)):
            if isinstance(event, StepEvent):
                assert event.drafted == 1
                kept += event.accepted
            elif isinstance(event, TokenEvent):
                firsts.append((event.token,))
                break
    generator.reset()
    return firsts, kept


@pytest.mark.parametrize("broken", [False, True], ids=["engine", "control: top-k floor too high"])
def test_the_gemma_pairs_first_token_is_the_targets(gemma_pair, expected, broken, monkeypatch) -> None:
    target, draft = gemma_pair
    _, distribution = expected
    if broken:  # the floor at the largest column maximum: top-k keeps the top token's column only
        monkeypatch.setattr(sampling_module, "_top_k_floor", lambda column_max, k: column_max.max())
    observed, kept = first_tokens(target, make_drafter("model", draft, target), GEMMA_SAMPLES)
    check(observed, distribution, kept, broken)


@pytest.mark.parametrize("broken", [False, True], ids=["engine", "control: shared tokens not renormalised"])
def test_a_draft_of_another_vocabulary_keeps_the_targets_first_token(gemma_pair, expected, qwen_files, broken,
                                                                     monkeypatch) -> None:
    target, _ = gemma_pair
    _, distribution = expected
    if broken:
        restrict = translated_module.on_shared_tokens

        def unnormalised(q, shared):  # the restricted weights reported as probabilities, without their sum
            restricted = restrict(q, shared)
            return restricted and sampling_module.Distribution(restricted.ids, restricted.weights, restricted.size, 1.0)

        monkeypatch.setattr(translated_module, "on_shared_tokens", unnormalised)
    with Model(qwen_files.draft_path, LoadOptions(n_ctx=512)) as draft:
        drafter = make_drafter("model", draft, target)
        assert drafter.model.shared is not None  # it drafts shared tokens (TLI)
        observed, kept = first_tokens(target, drafter, CROSS_CONTROL_SAMPLES if broken else CROSS_SAMPLES)
    check(observed, distribution, kept, broken)


def check(observed: list[tuple[int, ...]], distribution: dict, kept: int, broken: bool) -> None:
    p_value = chi_square_p_value(observed, distribution)
    if broken:
        assert p_value < 1e-6, f"the broken engine passed: p={p_value:.2e}"
    else:
        # Gemma's own draft keeps nearly all of its tokens here, Qwen's about a sixth: both exercise
        # acceptance and the residual.
        assert kept > len(observed) / 10, f"only {kept} draft tokens kept: the rule was hardly exercised"
        assert p_value > 1e-3, f"p={p_value:.2e}"


@pytest.fixture(scope="module")
def qwen_files():
    from speccli.models.config import load_registry
    from speccli.models.resolve import resolve_pair

    return resolve_pair("qwen2.5-coder-1.5b", None, None, load_registry(), quiet=True)
