"""The replay benchmark (tests/benchmarks/replay.py) on the tiny related pair: its accounting, and that
the same recording and costs give the same figures."""
from __future__ import annotations

import pytest

from speccli.drafting.policy import VerifyCosts
from tests.benchmarks.replay import record, replay
from tests.conftest import loaded_related_pair

COSTS = VerifyCosts({1: 1.0, 2: 1.3, 4: 1.6, 8: 2.2, 16: 3.5})
C = 0.4


@pytest.fixture(scope="module")
def replies(tmp_path_factory):
    with loaded_related_pair(tmp_path_factory.mktemp("replay"), target_layers=4, draft_layers=2, eps=0.1) as (target, draft):
        prompts = [(task, target.tokenizer.tokenize(text)) for task, text in (("a", "a b c d a b"), ("b", "x y z"))]
        yield record(target, draft, prompts, n_predict=12)


def test_a_fixed_k_replay_prices_each_step_as_drafted_and_kept(replies) -> None:
    """K=2 from the draft model: each step drafts min(2, tokens left - 1) recorded tokens, keeps them up
    to the first that differs from the reply, and costs k draft decodes and a verify of k + 1 rows."""
    assert all(reply.tokens for reply in replies)
    outcomes = set()
    for reply in replies:
        t, cost = 0, 0.0
        while t < len(reply.tokens):
            k = min(2, len(reply.tokens) - t - 1)
            drafted = [token for token, _ in reply.drafts[t][:k]]
            kept = next((i for i, token in enumerate(drafted) if token != reply.tokens[t + i]), k)
            cost += k * C + COSTS.decode(k + 1)
            outcomes.add(kept == k)
            t += kept + 1
        assert replay([reply], "model", 2, 1, C, COSTS)[reply.task] == [pytest.approx(len(reply.tokens) / cost)]
    assert outcomes == {True, False}  # drafts kept whole and drafts cut short both priced


def test_the_same_recording_and_costs_give_the_same_figures(replies) -> None:
    for spec in ("ngram+model", "ngram", "model"):
        assert replay(replies, spec, None, 2, C, COSTS) == replay(replies, spec, None, 2, C, COSTS)
