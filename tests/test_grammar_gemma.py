"""Structured output on the real Gemma pair: the law inside a JSON value at chat's defaults, and greedy
replies under a schema identical to the target alone's.

The law's row comes from outside the engine: llama-cpp-python's own evaluation (its high-level `Llama`)
of the prompt and the tokens the schema forces, masked by a fresh llguidance matcher at that point, put
through the filters' dense definition (tests/test_sparse_sampling.py). The engine drafts the forced
tokens and a draft model's masked tokens, and verifies them in one batched decode of the F32 target.
Controls, run the same way, must fail: the mask applied after the filters, and the mask on the draft's
rows only (tests/test_grammar.py defines both).
"""
from __future__ import annotations

import json

import llama_cpp
import numpy as np
import pytest

from speccli.bench.prompts import load_prompt_set
from speccli.core.constraint import Grammar, GrammarError, GrammarSpec
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.core.stats import TokenEvent
from speccli.drafting.policy import FixedK
from speccli.drafting.specs import make_drafter, make_policy
from tests.test_grammar import mask_after_the_filters, mask_on_the_draft_only
from tests.test_sparse_sampling import reference_row
from tests.token_distribution import chi_square_p_value

CHAT = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
# Moods the model itself would hardly write: its raw top tokens are others (98% of the filtered mass), so
# filtering before masking keeps a few legal tokens by the raw row's cut-offs, not the law's.
# Its layout fixed (a schema's own `x-guidance` settings come first), so that `{"mood": "` is forced and
# the first free token is inside the value.
MOOD = {"type": "object", "properties": {"mood": {"enum": ["grumpy", "cheerful", "anxious", "relaxed"]}},
        "required": ["mood"], "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
PROMPT = "She had missed the last bus home, it was raining, and her phone was dead. Her mood as JSON: "
SAMPLES = 200
CONTROL_SAMPLES = 120  # the mask-after-the-filters control's chi-square was 362 at 400 draws, 137 at 150


@pytest.fixture(scope="module")
def mood(gemma_pair):
    target, _ = gemma_pair
    return Grammar(GrammarSpec.json_schema(MOOD), target.tokenizer.grammar_vocabulary(), target.n_vocab)


@pytest.fixture(scope="module")
def expected(gemma_pair, mood):
    """The law's distribution of the reply's first token that the schema leaves free (after the forced
    `{"mood": "`), and how many forced tokens come before it."""
    target, _ = gemma_pair
    constraint = mood.start()
    forced = constraint.forced(64)
    for token in forced:  # forced: the only token allowed, so the law gives it probability 1
        assert np.flatnonzero(constraint.allowed()).tolist() == [token]
        constraint.push([token])
    prompt = target.tokenizer.tokenize(PROMPT)
    llama = llama_cpp.Llama(str(target.path), n_ctx=512, n_batch=64, verbose=False)
    try:
        llama.eval(prompt + forced)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(llama.n_vocab(),)).copy()
    finally:
        llama.close()
    logits[~constraint.allowed()] = -np.inf
    finite = np.sort(logits[np.isfinite(logits)])[::-1].astype(np.float64)
    assert len(finite) < CHAT.top_k and np.abs(finite - (finite[0] + np.log(CHAT.min_p))).min() > 0.01, "at a filter's edge"
    row = reference_row(logits, CHAT)
    return prompt, forced, {(*forced, int(token)): float(row[token]) for token in np.flatnonzero(row > 0)}


def first_tokens(generator: Generator, prompt: list[int], grammar: Grammar, length: int, samples: int = SAMPLES):
    """The first `length` tokens of `samples` replies, each given room for one more: the step that drafts
    the forced tokens has room left to draft the free one too (else it is only ever the bonus)."""
    replies = []
    for _ in range(samples):
        events = generator.generate(prompt, GenerationLimits(length + 1, grammar=grammar))
        replies.append(tuple(event.token for event in events if isinstance(event, TokenEvent))[:length])
    return replies


def test_the_first_free_token_of_a_json_value_follows_the_law_on_gemma(gemma_pair, mood, expected) -> None:
    """The schema's four forced tokens and the draft model's masked token, verified in one decode."""
    target, draft = gemma_pair
    prompt, forced, law = expected
    generator = Generator(target, make_drafter("model", draft, target), CHAT, FixedK(2), seed=7)
    p = chi_square_p_value(first_tokens(generator, prompt, mood, len(forced) + 1), law)
    assert p > 1e-3, f"p = {p:.2e}"


@pytest.mark.parametrize("broken", [lambda: mask_after_the_filters(CHAT), mask_on_the_draft_only],
                         ids=["mask_after_the_filters", "mask_on_the_draft_only"])
def test_a_broken_grammar_engine_fails_the_law_on_gemma(gemma_pair, mood, expected, broken) -> None:
    target, draft = gemma_pair
    prompt, forced, law = expected
    generator = Generator(target, make_drafter("model", draft, target), CHAT, FixedK(2), seed=7)
    with broken():
        try:
            p = chi_square_p_value(first_tokens(generator, prompt, mood, len(forced) + 1, CONTROL_SAMPLES), law)
        except GrammarError:  # the target's own token was one the grammar forbids: as wrong as it gets
            p = 0.0
    assert p < 1e-6, f"p = {p:.2e}"


def test_greedy_replies_under_a_schema_are_the_target_alones_on_gemma(gemma_pair) -> None:
    """A built-in extraction prompt under docs/examples/extract.schema.json, 48 tokens: the default source
    and a draft model at K = 4 give the target alone's tokens (bench's greedy check covers all eight)."""
    target, draft = gemma_pair
    schema = json.loads(open("docs/examples/extract.schema.json").read())
    grammar = Grammar(GrammarSpec.json_schema(schema), target.tokenizer.grammar_vocabulary(), target.n_vocab)
    greedy = SamplingParams(temperature=0)
    prompts = [prompt.prompt for prompt in load_prompt_set(None, structured=True).prompts][:1]
    for text in prompts:
        prompt = target.tokenizer.tokenize(text)
        replies = {}
        for spec, k in ((None, None), ("model", 4), ("suffix+model", "auto")):
            drafter = None if spec is None else make_drafter(spec, draft, target)
            generator = Generator(target, drafter, greedy, None if k is None else make_policy(k), seed=0)
            generator.reset()
            replies[spec] = [event.token for event in generator.generate(prompt, GenerationLimits(48, grammar=grammar))
                             if isinstance(event, TokenEvent)]
        assert replies["model"] == replies[None] and replies["suffix+model"] == replies[None], text
