"""The two-token distribution check, shared by tests/test_engine_distribution.py and the device check
(.ci/device/check.py, which runs where scipy is not installed: nothing here needs it).

The exact joint distribution of the first two generated tokens comes from the target's own logits
(one decode per first token); sampled generations are grouped into the cells a chi-square test
compares with it. Each caller turns the cells into a p-value its own way.
"""
from __future__ import annotations

import numpy as np

from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams, probabilities
from speccli.core.stats import RunStats, TokenEvent
from speccli.llama.model import Model


def exact_two_token_distribution(target: Model, prompt: list[int], sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first two tokens) under the target alone; a sequence that ends first is one token long."""
    target.reset()
    target.decode(prompt[:-1], n_logit_rows=0)
    first = probabilities(target.decode(prompt[-1:]), sampling)[0]
    joint = {}
    for token in np.flatnonzero(first > 0):
        if target.tokenizer.is_end_of_generation(int(token)):
            joint[(int(token),)] = float(first[token])  # generation ends there
            continue
        target.truncate(len(prompt))
        second = probabilities(target.decode([int(token)]), sampling)[0]
        for following in np.flatnonzero(second > 0):
            joint[(int(token), int(following))] = float(first[token] * second[following])
    target.reset()
    return joint


def sampled_pairs(generator: Generator, prompt: list[int], n: int, max_tokens: int = 4) -> list[tuple[int, ...]]:
    return sampled_pairs_and_stats(generator, prompt, n, max_tokens)[0]


def sampled_pairs_and_stats(generator: Generator, prompt: list[int], n: int, max_tokens: int = 4):
    """The first two tokens of n generations, and their summed statistics; the end-of-generation
    token is kept when it comes first.

    Each generation asks for k+1 tokens (`max_tokens`), so its first step may draft all k (the engine
    drafts no more than a reply still needs). The pair is shaped by the first two positions' accept
    and resample, and, at k = 1, by the bonus token; a longer draft's later positions are left to the
    enumeration in tests/test_verify_exact.py.
    """
    pairs, total = [], RunStats()
    for _ in range(n):
        events = list(generator.generate(prompt, GenerationLimits(max_tokens=max_tokens)))
        total = total + events[-1].stats
        tokens = [e.token for e in events if isinstance(e, TokenEvent)][:2]
        if len(tokens) < 2 and events[-1].reason == "eog":
            tokens.append(generator.tokens[len(prompt) + len(tokens)])
        pairs.append(tuple(tokens))
    return pairs, total


