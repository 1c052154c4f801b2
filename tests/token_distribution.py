"""The first tokens of sampled generations against the target alone's exact distribution.

The exact joint of the first `length` generated tokens comes from the target's own logits, by walking
its tree (one one-token decode per prefix); generations are sampled through `Generator` with their
steps kept, so a test can also pick out tokens by how they were made (a bonus after k kept drafts) and
compare them with the target's row for their prefix. Chi-square p-values come from scipy; every one is
also written, with its statistic, degrees of freedom and draws, to the file SPECCLI_CHI2_LOG names, if
set: tests/benchmarks/chi_square_power.py reads them to state each test's power against its controls.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams, probabilities
from speccli.core.stats import RunStats, StepEvent, TokenEvent
from speccli.llama.model import Model


def exact_distribution(target: Model, prompt: list[int], sampling: SamplingParams, length: int) -> dict[tuple[int, ...], float]:
    """P(first `length` generated tokens) under the target alone; a sequence that ends first (an
    end-of-generation token) is shorter. Leaves the target's cache empty."""
    joint: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], probability: float) -> None:
        # The cache holds (prompt + prefix)[:-1].
        row = probabilities(target.decode([(prompt + list(prefix))[-1]]), sampling)[0].astype(np.float64)
        for token in np.flatnonzero(row > 0):
            sequence, weight = prefix + (int(token),), probability * row[token]
            if len(sequence) == length or target.tokenizer.is_end_of_generation(int(token)):
                joint[sequence] = weight
            else:
                target.truncate(len(prompt) + len(prefix))
                walk(sequence, weight)

    target.reset()
    if len(prompt) > 1:
        target.decode(prompt[:-1], n_logit_rows=0)
    walk((), 1.0)
    target.reset()
    return joint


def next_token_row(target: Model, context: list[int], sampling: SamplingParams) -> np.ndarray:
    """The target alone's distribution of the token after `context` (float64). Leaves the cache empty."""
    target.reset()
    if len(context) > 1:
        target.decode(context[:-1], n_logit_rows=0)
    row = probabilities(target.decode(context[-1:]), sampling)[0].astype(np.float64)
    target.reset()
    return row


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]  # every generated token, an end-of-generation token included
    steps: tuple[tuple[StepEvent, tuple[int, ...]], ...]  # each step with the tokens it gave

    def first(self, length: int) -> tuple[int, ...]:
        return self.tokens[:length]

    def bonuses(self, at_least: int) -> list[tuple[tuple[int, ...], int]]:
        """(the generated tokens before it, the token) for every bonus token drawn after `at_least` or
        more drafts were all kept."""
        found, before = [], 0
        for step, tokens in self.steps:
            if step.drafted >= at_least and step.accepted == step.drafted and len(tokens) == step.drafted + 1:
                found.append((self.tokens[: before + step.drafted], tokens[-1]))
            before += len(tokens)
        return found


def sample_generations(generator: Generator, prompt: list[int], n: int, max_tokens: int) -> tuple[list[Generation], RunStats]:
    """n generations of up to `max_tokens` tokens, and their summed statistics."""
    generations, total = [], RunStats()
    for _ in range(n):
        events = list(generator.generate(prompt, GenerationLimits(max_tokens=max_tokens)))
        done = events[-1]
        total = total + done.stats
        tokens, steps = [], []
        for event in events[:-1]:
            if isinstance(event, StepEvent):
                steps.append([event, []])
            elif isinstance(event, TokenEvent):
                tokens.append(event.token)
                steps[-1][1].append(event.token)
        if done.reason == "eog":  # the end-of-generation token is not given as an event
            eog = generator.tokens[len(prompt) + len(tokens)]
            tokens.append(eog)
            steps[-1][1].append(eog)
        generations.append(Generation(tuple(tokens), tuple((step, tuple(given)) for step, given in steps)))
    return generations, total


def cells(observed: list, expected: dict, n: int) -> tuple[list[float], list[float]]:
    """Observed and expected counts: outcomes expected at least 5 times one by one, the rest lumped in
    one cell (left out where nothing is expected there)."""
    counts: dict = {}
    for outcome in observed:
        counts[outcome] = counts.get(outcome, 0) + 1
    big = [outcome for outcome, probability in expected.items() if probability * n >= 5]
    observed_counts = [counts.get(outcome, 0) for outcome in big]
    expected_counts = [expected[outcome] * n for outcome in big]
    rest_expected = n - sum(expected_counts)
    if rest_expected > 1e-9 * n or n - sum(observed_counts):
        observed_counts.append(n - sum(observed_counts))
        expected_counts.append(max(rest_expected, 1e-12))
    return observed_counts, expected_counts


def chi_square_p_value(observed: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> float:
    """Goodness of fit of the sampled outcomes to `expected`; 0 where one was sampled that the target
    gives probability 0 (the strongest evidence against it)."""
    if not {outcome for outcome in observed} <= set(expected):
        return 0.0
    return p_value_of(*cells(observed, expected, len(observed)))


def grouped_chi_square_p_value(groups: list[tuple[list[int], np.ndarray]]) -> float:
    """One chi-square over several groups of draws, each against its own distribution (a row of
    probabilities): given how many draws each group has, their counts are independent multinomials, so
    the statistics add up, with one degree of freedom fewer per group than it has cells."""
    observed_counts, expected_counts, groups_used = [], [], 0
    for tokens, row in groups:
        if any(row[token] == 0 for token in tokens):
            return 0.0
        expected = {int(token): float(row[token]) for token in np.flatnonzero(row > 0)}
        observed, expected_group = cells(tokens, expected, len(tokens))
        if len(observed) < 2:
            continue  # one cell: nothing to compare
        observed_counts += observed
        expected_counts += expected_group
        groups_used += 1
    assert groups_used, "no group has two cells"
    return p_value_of(observed_counts, expected_counts, groups_used)


def p_value_of(observed_counts: list[float], expected_counts: list[float], groups: int = 1) -> float:
    """Pearson's chi-square p-value over these cells (`groups` multinomials: one degree of freedom fewer
    each), recorded where SPECCLI_CHI2_LOG asks."""
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed_counts, expected_counts))
    degrees = len(observed_counts) - groups
    log = os.environ.get("SPECCLI_CHI2_LOG")
    if log:
        with open(log, "a") as file:
            draws = round(sum(observed_counts))
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            file.write(json.dumps({"test": test, "statistic": statistic, "degrees": degrees, "draws": draws}) + "\n")
    from scipy import stats  # here, not at the top: the device check imports `cells` where no scipy is

    return float(stats.chi2.sf(statistic, degrees))
