"""The hindsight benchmark (tests/benchmarks/hindsight.py): it prices steps as the replay does, and its
hindsight optimum is the cheapest way through a reply."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from speccli.drafting.policy import VerifyCosts

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))  # hindsight.py imports replay.py as a script does
from hindsight import Pricing, kept_runs, ramp_rule  # noqa: E402
from replay import Reply, replay  # noqa: E402

COSTS = VerifyCosts({1: 1.0, 2: 1.3, 4: 1.6, 8: 2.2, 16: 3.5})
C = 0.4


def reply_missing_at(tokens: list[int], misses: set[int]) -> Reply:
    """A reply whose draft, from any position, proposes the reply's own tokens up to a position in
    `misses`, where it proposes 0 (no token of the reply)."""
    drafts = []
    for t in range(len(tokens)):
        continuation = []
        for position in range(t, len(tokens)):
            continuation.append((0 if position in misses else tokens[position], 0.9))
            if position in misses:
                break
        drafts.append(continuation)
    return Reply("t", [1, 2], tokens, drafts)


def test_runs_count_the_draft_tokens_kept_from_each_position() -> None:
    assert kept_runs(reply_missing_at([5, 6, 7, 8, 9], {2})) == [2, 1, 0, 2, 1]


def test_fixed_k_is_priced_as_the_replay_prices_it() -> None:
    reply = reply_missing_at(list(range(10, 30)), {3, 11, 12})
    for k in (1, 2, 4, 8):
        assert [Pricing(reply, C, COSTS).fixed(k)] == pytest.approx(replay([reply], "model", k, 1, C, COSTS)["t"])


def test_the_hindsight_optimum_is_the_cheapest_way_through_the_reply() -> None:
    # Four tokens, the draft always right: drafting 3 at once costs 3c + V(4) = 2.8, where two steps of
    # one draft token cost 2 (c + V(2)) = 3.4 and four plain steps 4.
    assert Pricing(reply_missing_at([5, 6, 7, 8], set()), C, COSTS).cheapest[0] == pytest.approx(3 * C + 1.6)
    # A miss at position 1: draft 1 (kept) and take the target's token there, then 1 more with the last
    # plain: c + V(2) + c + V(2) = 3.4; drafting 3 at first would waste two decodes (1.2 + 1.6, then 1.3).
    missed = Pricing(reply_missing_at([5, 6, 7, 8], {1}), C, COSTS)
    assert missed.cheapest[0] == pytest.approx(2 * (C + 1.3))
    reply = reply_missing_at(list(range(10, 40)), {4, 9, 17, 18, 25})
    pricing = Pricing(reply, C, COSTS)
    best = pricing.hindsight()
    assert all(pricing.fixed(k) <= best + 1e-12 for k in range(25))
    assert max(pricing.fixed(k) for k in range(25)) < best  # no one K fits misses at these gaps


def test_a_ramp_rule_grows_while_drafts_are_kept_whole_and_falls_to_twice_the_run_kept() -> None:
    choose = ramp_rule(first=4, growth=3)
    assert choose(0, None, None) == 4
    assert choose(5, 4, 4) == 12 and choose(9, 12, 12) == 24  # capped at the longest draft
    assert choose(9, 12, 3) == 6 and choose(9, 12, 0) == 1
