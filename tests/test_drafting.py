"""Draft sources and K policies on their own: what the n-gram lookup proposes, how the chain picks a
source, which K `auto` chooses for given costs and acceptance, and how --spec/--k are checked."""
from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from speccli.core.sampling import SamplingParams
from speccli.core.stats import StepEvent
from speccli.core.seam import NO_PLAN, CostProfile, Draft, DraftCosts, Plan, Segment
from speccli.drafting.planner import Planner
from speccli.drafting.model import CATCH_UP_SIZES, Intake, ModelDrafter
from speccli.drafting.ngram import Match, NgramLookup
from speccli.drafting.policy import (
    FIRST_PROBE_AFTER, LONG_RECENCY, RAMP_START, AutoK, FixedK,
)
from speccli.drafting.acceptance import MEMORY, RECENCY
from speccli.drafting.costs import TIMING_WEIGHT, VerifyCosts
from speccli.drafting.specs import make_drafter
from speccli.errors import SpeccliError, WrongTypeError
from speccli.llama.model import LoadOptions, Model
from speccli.drafting.registry import check_spec, parse_spec_list, uses_draft_model
from speccli.validation import parse_k, parse_k_sweep

GREEDY = SamplingParams(temperature=0)


class Answers:
    """A K policy that answers as told: `length_for` and `best_rate` give a plan's k and rate (None: no
    estimates, as a fixed K)."""

    name, needs_costs, profiled_sizes, reply = "answers", False, (), None

    def __init__(self, length_for, best_rate) -> None:
        self.length_for, self.best_rate = length_for, best_rate
        self.owed_prompts: list[int] = []  # as each plan was told

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        self.owed_prompts.append(owed_prompt)
        return Plan(self.length_for(key, available, catch_up), self.best_rate(key, available, catch_up))


@dataclass
class Request:
    context: list[int]
    limit: int
    policy: Answers


def request(
    context,
    limit=16,
    length_for=lambda key, available, catch_up: available,
    best_rate=lambda key, available, catch_up: None,
) -> Request:
    return Request(list(context), limit, Answers(length_for, best_rate))


def propose(drafting, asked: Request) -> Draft:
    """A step's draft from a planner, or from a planner of this one source."""
    if not isinstance(drafting, Planner):
        drafting = Planner(model=drafting) if isinstance(drafting, ModelDrafter) else Planner(drafting)
    return drafting.draft(asked.context, asked.limit, GREEDY, np.random.default_rng(0), asked.policy)


def key_of(draft: Draft) -> str:
    """The key the policy learns a draft's first segment by ("" where nothing was asked to draft)."""
    return draft.segments[0].key if draft.segments else ""


# --- n-gram lookup ---------------------------------------------------------------------------------


def test_ngram_proposes_what_followed_the_longest_earlier_match() -> None:
    # "5 6" occurs twice before the end; the longer match "4 5 6" picks the second occurrence.
    context = [1, 5, 6, 9, 9, 4, 5, 6, 7, 8, 2, 4, 5, 6]
    draft = propose(NgramLookup(), request(context))
    assert draft.tokens == [7, 8, 2, 4, 5, 6] and draft.q is None and draft.source == "ngram"
    assert key_of(draft) == "ngram:3-5/once"  # matched "4 5 6": three tokens, which occurred once before


def test_ngram_takes_the_most_recent_occurrence_of_an_equally_long_match() -> None:
    draft = propose(NgramLookup(), request([3, 1, 2, 3, 7, 3]))
    assert draft.tokens == [7, 3]  # "3" last occurred before 7, not before 1
    assert key_of(draft) == "ngram:1-2/varied"


def test_ngram_key_tells_how_the_match_went_on_where_it_occurred_before() -> None:
    """"1 2" occurred twice before the end: followed by 3 both times, or by 3 and then 4."""
    same = propose(NgramLookup(), request([1, 2, 3, 9, 1, 2, 3, 8, 1, 2]))
    assert same.tokens == [3, 8, 1, 2] and key_of(same) == "ngram:1-2/same"
    varied = propose(NgramLookup(), request([1, 2, 3, 9, 1, 2, 4, 8, 1, 2]))
    assert varied.tokens == [4, 8, 1, 2] and key_of(varied) == "ngram:1-2/varied"


def test_ngram_match_length_counts_past_twelve_tokens() -> None:
    phrase = list(range(100, 130))
    draft = propose(NgramLookup(), request(phrase + [1, 2] + phrase, limit=4))
    assert draft.tokens == [1, 2, 100, 101] and key_of(draft) == "ngram:12+/once"


def test_ngram_prefers_a_longer_match_to_a_more_recent_one_past_eight_tokens() -> None:
    # "20..31" (12 tokens) occurred once long ago, followed by 7; its last 8 tokens also occur later,
    # followed by 8. The longest match wins, whatever its length.
    phrase = list(range(20, 32))
    context = [1] + phrase + [7, 2, 3] + [5] + phrase[4:] + [8, 2] + phrase
    draft = propose(NgramLookup(), request(context, limit=1))
    assert draft.tokens == [7] and key_of(draft) == "ngram:12+/once"


def test_ngram_repeats_a_match_as_long_as_its_period_past_the_context_end() -> None:
    """"7 8 7 8 7 8" matches itself two tokens back: a text repeating with period 2, so the proposal
    goes on repeating it where the earlier text ends; "1 2 3 1 2 3" has repeated once, a match as long
    as its period. A match shorter than its distance to the end says nothing of what comes after that
    (no repeating: the proposal stops at the context's end)."""
    looping = propose(NgramLookup(), request([1, 7, 8, 7, 8, 7, 8], limit=5))
    assert looping.tokens == [7, 8, 7, 8, 7] and key_of(looping) == "ngram:3-5/once"  # "7 8 7 8", once
    assert propose(NgramLookup(), request([4, 4, 4], limit=3)).tokens == [4, 4, 4]
    assert propose(NgramLookup(), request([1, 2, 3, 1, 2, 3], limit=5)).tokens == [1, 2, 3, 1, 2]
    assert propose(NgramLookup(), request([5, 1, 2, 3, 1, 2], limit=5)).tokens == [3, 1, 2]


def test_ngram_index_holds_a_few_bytes_per_token() -> None:
    """16,000 text-like tokens: the index is its position arrays (4 bytes a token), not a dict entry
    per n-gram (the tuple index this replaced held 8 MiB)."""
    rng = np.random.default_rng(2)
    context = [int(x) % 150_000 for x in rng.zipf(1.3, size=16_000)]
    tracemalloc.start()
    try:
        drafter = NgramLookup()
        drafter.sync(context)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1_000_000
    assert key_of(propose(drafter, request(context + context[:20]))) == "ngram:12+/once"


def test_ngram_with_no_earlier_occurrence_proposes_nothing() -> None:
    assert propose(NgramLookup(), request([1, 2, 3, 4])).tokens == []


def test_ngram_respects_the_limit_and_the_policy() -> None:
    context = [1, 2, 3, 4, 5, 1, 2]
    assert propose(NgramLookup(), request(context, limit=2)).tokens == [3, 4]
    asked = []
    draft = propose(NgramLookup(), request(context, length_for=lambda key, available, catch_up: asked.append((key, available)) or 1))
    assert draft.tokens == [3] and asked == [("ngram:1-2/once", 5)]  # 3 4 5 1 2 follow the match


def test_ngram_hands_a_match_it_is_told_not_to_draft_on_as_a_shadow() -> None:
    context = [1, 2, 3, 4, 5, 1, 2]
    draft = propose(NgramLookup(), request(context, length_for=lambda key, available, catch_up: 0))
    assert draft.tokens == [] and key_of(draft) == ""  # nothing verified, nothing learnt as a draft
    assert draft.judged.tokens == [3, 4, 5, 1, 2] and draft.judged.key == "ngram:1-2/once"
    assert propose(NgramLookup(), request(context)).judged is None  # drafted: judged by verifying it


def test_ngram_index_after_forget_equals_a_fresh_index() -> None:
    rng = np.random.default_rng(1)
    context = [int(x) for x in rng.integers(0, 6, size=300)]
    incremental = NgramLookup()
    for end in range(10, 300, 7):
        propose(incremental, request(context[:end]))
    incremental.forget(150)
    replaced = context[:150] + [int(x) for x in rng.integers(0, 6, size=100)]
    fresh = NgramLookup()
    for end in range(151, 250):
        assert propose(incremental, request(replaced[:end])) == propose(fresh, request(replaced[:end]))


# --- draft model ------------------------------------------------------------------------------------


def test_model_drafter_takes_in_unseen_context_timed_apart_and_drafts_as_if_it_had_kept_up(tiny_pair) -> None:
    """After lookup drafts were kept, the model first decodes what it missed; that time is reported as
    catch-up (the K policy leaves it out of the model's per-token cost) and the draft is unchanged."""
    prompt = list(range(3, 40))
    grown = prompt + list(range(60, 72))  # 12 tokens the model never saw
    with Model(tiny_pair.draft, LoadOptions(n_ctx=256, n_threads=1)) as model:
        drafter = ModelDrafter(model)
        drafter.sync(prompt)
        behind = propose(drafter, request(grown, length_for=lambda key, available, catch_up: 3))
        drafter.new_conversation()
        drafter.sync(grown)
        kept_up = propose(drafter, request(grown, length_for=lambda key, available, catch_up: 3))
    assert behind.tokens == kept_up.tokens and len(behind.tokens) == 3
    assert behind.catch_up_seconds > 0 and kept_up.catch_up_seconds == 0
    # The pending token is decoded with the draft's first: the 12 unseen ones but the last are caught up.
    assert behind.catch_up_tokens == 12 and kept_up.catch_up_tokens == 0


def test_model_drafter_tells_the_policy_how_far_behind_it_is_before_it_drafts(tiny_pair) -> None:
    prompt = list(range(3, 40))
    asked = []
    with Model(tiny_pair.draft, LoadOptions(n_ctx=256, n_threads=1)) as model:
        drafter = ModelDrafter(model)
        drafter.sync(prompt)
        record = lambda key, available, catch_up: asked.append(catch_up) or 2  # noqa: E731
        drafted = propose(drafter, request(prompt, length_for=record)).tokens
        assert drafter.catch_up_tokens(prompt) == 0  # only the pending token: decoded with the first draft
        after_its_draft = prompt + drafted + [5]  # both kept, and a bonus token: what a step leaves behind
        assert drafter.catch_up_tokens(after_its_draft) == 0
        skipped = after_its_draft + [6, 7, 8]  # three tokens another source drafted, and its bonus
        assert drafter.catch_up_tokens(skipped) == 4
        propose(drafter, request(skipped, length_for=record))
    assert asked == [0, 4]


def test_model_drafter_takes_in_its_prompt_at_its_first_draft_reported_as_the_prefills(tiny_pair) -> None:
    """A reply other sources draft throughout never pays for the draft model's prompt; one it drafts in
    pays at its first draft, reported apart (the prefill's time: neither its per-token cost nor a
    catch-up) and priced apart (the policy is told the prompt it owes), and the draft is what an eager
    sync would have drafted."""
    prompt = list(range(3, 40))
    asked = []
    with Model(tiny_pair.draft, LoadOptions(n_ctx=256, n_threads=1)) as model:
        drafter = ModelDrafter(model)
        drafter.sync(prompt)
        declined = propose(drafter, asking := request(prompt, length_for=lambda key, available, catch_up: asked.append(catch_up) or 0))
        assert model.n_past == 0 and declined.prompt_tokens == 0
        assert declined.tokens == [] and key_of(declined) == "model" and declined.source == ""  # still learnt from
        deferred = propose(drafter, request(prompt, length_for=lambda key, available, catch_up: asked.append(catch_up) or 3))
        after = propose(drafter, telling := request(prompt + deferred.tokens + [5], length_for=lambda key, available, catch_up: 0))
        assert asking.policy.owed_prompts == [len(prompt) - 1] and telling.policy.owed_prompts == [0]
        assert after.prompt_tokens == 0
        drafter.new_conversation()
        model.decode(prompt[:-1], n_logit_rows=0)  # what the sync did in the prefill before
        eager = propose(drafter, request(prompt, length_for=lambda key, available, catch_up: 3))
    assert asked == [0, 0]
    assert deferred.prompt_tokens == len(prompt) - 1 and deferred.prompt_seconds > 0
    assert deferred.catch_up_tokens == 0 and deferred.catch_up_seconds == 0
    assert deferred.tokens == eager.tokens and len(eager.tokens) == 3 and eager.prompt_tokens == 0


def test_model_drafter_takes_in_all_but_the_last_batch_of_a_long_prompt_in_the_prefill(tiny_pair) -> None:
    """A decode inside a draft cannot be stopped (the prefill checks for a stop between batches), so
    what a sync defers is at most one batch."""
    prompt = list(range(3, 103))
    with Model(tiny_pair.draft, LoadOptions(n_ctx=256, n_batch=32, n_threads=1)) as model:
        drafter = ModelDrafter(model)
        drafter.sync(prompt[:40])
        assert model.n_past == 39 - 32
        drafter.sync(prompt)
        assert model.n_past == len(prompt) - 1 - 32
        drafted = propose(drafter, request(prompt, length_for=lambda key, available, catch_up: 2))
    assert drafted.prompt_tokens == 32


def test_model_drafter_times_a_token_and_catch_ups_and_leaves_its_cache_as_it_was(tiny_pair) -> None:
    prompt = list(range(3, 40))
    with Model(tiny_pair.draft, LoadOptions(n_ctx=256, n_threads=1)) as model:
        drafter = ModelDrafter(model)
        drafter.sync(prompt)
        model.decode(prompt[:10], n_logit_rows=0)  # what it held: the prompt itself it takes in at its first draft
        costs = drafter.costs(prompt)["model"]
        assert model.n_past == 10
    assert costs.token_seconds > 0
    assert sorted(costs.catch_up_seconds) == list(CATCH_UP_SIZES) and all(s > 0 for s in costs.catch_up_seconds.values())


def test_the_planner_hands_a_model_draft_over_to_the_lookup_where_it_is_expected_to_pay_more(tiny_pair) -> None:
    """After each model token the lookup is asked to go on from there; its index is cut back after each look."""
    prompt = list(range(3, 40))
    estimates = lambda key, available, catch_up: 2.0 if key.startswith("ngram") else 1.0  # noqa: E731
    with Model(tiny_pair.draft, LoadOptions(n_ctx=256, n_threads=1)) as model:
        drafter = ModelDrafter(model)
        drafter.sync(prompt)
        full = propose(drafter, request(prompt, length_for=lambda key, available, catch_up: 5))
        drafter.forget(len(prompt) - 1)
        lookup = ScriptedLookup({len(prompt) + 2: [90, 91]})
        handed = propose(Planner(lookup, drafter), request(prompt, length_for=lambda key, available, catch_up: 5, best_rate=estimates))
    assert full.continuation is None and len(full.tokens) == 5
    assert lookup.asked == [len(prompt), len(prompt) + 1, len(prompt) + 2] and lookup.forgotten == [len(prompt)] * 2
    assert handed.tokens == full.tokens[:2] + [90, 91] and handed.continuation.tokens == [90, 91]
    assert handed.segments[0].tokens == full.tokens[:2] and handed.source == "model"


def test_auto_learns_a_taken_over_draft_by_source_and_ramps_by_every_token_it_led_to() -> None:
    policy = calibrated(MEMORY_BOUND, {"model": 0.3})
    handed = Draft((Segment("model", "model", [0, 0], Plan(2)), Segment("ngram", "ngram:6-11", [0] * 5, Plan(5))))
    observe(policy, handed, StepEvent(7, 6, 0.015, policy.verify(8), 0.0, "model", continuation=("ngram", 5)))
    model, lookup = policy.keys["model"], policy.keys["ngram:6-11"]
    assert model.acceptance.judged_at == [1, 1] and model.acceptance.kept_at == [1, 1]  # its own two, both kept
    assert lookup.acceptance.judged_at == [1, 1, 1, 1, 1] and lookup.acceptance.kept_at == [1, 1, 1, 1, 0]
    assert model.schedule.last_kept == 6  # its draft led to six kept tokens: its ramp grows by them all
    assert RAMP_START < policy.plan("model", 24).k <= 12
    observe(policy, handed, StepEvent(7, 1, 0.015, policy.verify(8), 0.0, "model", continuation=("ngram", 5)))
    r = model.acceptance.recency
    assert model.acceptance.judged_at == pytest.approx([1 + r, 1 + r]) and model.acceptance.kept_at == pytest.approx([1 + r, r])
    assert lookup.acceptance.judged_at == [1, 1, 1, 1, 1]  # never reached: the lookup's tokens were not judged


def test_auto_leaves_catch_up_out_of_a_draft_models_token_cost() -> None:
    policy = calibrated(MEMORY_BOUND, {"model": 0.5})
    observe(policy, drafted_by("model", 4), StepEvent(4, 4, draft_seconds=4 * 0.01 + 0.3, target_seconds=policy.verify(5),
                                                      other_seconds=0.0, source="model", catch_up_seconds=0.3))
    assert policy.keys["model"].cost.token_seconds == pytest.approx(0.0125 + TIMING_WEIGHT * (0.01 - 0.0125))


# --- chain ------------------------------------------------------------------------------------------


class ScriptedLookup:
    """A lookup whose match after a context of n tokens is `matches[n]` (none where absent): a 3-token
    match that occurred once, of kind "ngram:3-5/once"."""

    name = "ngram"

    def __init__(self, matches: dict[int, list[int]] | None = None, everywhere: list[int] | None = None) -> None:
        self.matches, self.everywhere = matches or {}, everywhere
        self.asked, self.forgotten, self.kept_steps = [], [], []

    def match(self, context, limit):
        self.asked.append(len(context))
        tokens = self.matches.get(len(context), self.everywhere)
        return None if tokens is None else Match("ngram", 3, "once", tokens[:limit])

    def kept(self, tokens) -> None:
        self.kept_steps.append(list(tokens))

    def forget(self, n_tokens: int) -> None:
        self.forgotten.append(n_tokens)

    def sync(self, context) -> None:
        pass

    def new_conversation(self) -> None:
        pass

    def forget_all(self) -> None:
        pass


class ScriptedModel:
    """A draft model that drafts its tokens one by one (at most as many as it has), behind by `behind`."""

    name, drafts_by_token = "model", True

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.behind, self.owed, self.forgotten = tokens, 0, 0, []

    def room(self, context, limit: int) -> int:
        return min(limit, len(self.tokens))

    def catch_up_tokens(self, context) -> int:
        return self.behind

    def owed_prompt_tokens(self) -> int:
        return self.owed

    def begin(self, context, k: int) -> Intake:
        self.drawn = 0
        return Intake()

    def next(self, sampling, rng, constraint=None) -> tuple[int, None]:
        self.drawn += 1
        return self.tokens[self.drawn - 1], None

    def take(self, *tokens: int) -> None:
        pass

    def sync(self, context) -> None:
        pass

    def forget(self, n_tokens: int) -> None:
        self.forgotten.append(n_tokens)

    def new_conversation(self) -> None:
        pass

    def costs(self, context) -> dict[str, DraftCosts]:
        return {self.name: DraftCosts(0.5, {})}


RATES = {"ngram:3-5/once": 1.0, "model": 40.0}


def estimates(key: str, available: int, catch_up: int) -> float:
    return RATES[key]


def test_the_planner_passes_over_a_lookup_draft_the_model_is_expected_to_beat() -> None:
    planner = Planner(ScriptedLookup(everywhere=[4]), ScriptedModel([6, 7]))
    rates = {"ngram:3-5/once": 1.1, "model": 1.3}
    assert propose(planner, request([1], best_rate=lambda key, available, catch_up: rates[key])).source == "model"
    rates["ngram:3-5/once"] = 2.0
    assert propose(planner, request([1], best_rate=lambda key, available, catch_up: rates[key])).source == "ngram"


def test_the_planner_hands_the_lookup_proposal_it_passed_over_on_to_be_judged() -> None:
    planner = Planner(NgramLookup(), ScriptedModel([6, 7]))
    context = [1, 2, 3, 4, 5, 1, 2]
    planner.sync(context)
    rates = {"ngram:1-2/once": 1.1, "model": 1.3}
    draft = propose(planner, request(context, best_rate=lambda key, available, catch_up: rates[key]))
    assert draft.tokens == [6, 7] and draft.judged.tokens == [3, 4, 5, 1, 2]  # passed over for the model
    not_drafted = propose(planner, request(context, length_for=lambda key, available, catch_up: 0 if key.startswith("ngram") else available,
                                           best_rate=lambda key, available, catch_up: rates[key]))
    assert not_drafted.tokens == [6, 7] and not_drafted.judged.tokens == [3, 4, 5, 1, 2]  # not drafted at all
    rates["ngram:1-2/once"] = 2.0
    drafted = propose(planner, request(context, best_rate=lambda key, available, catch_up: rates[key]))
    assert drafted.tokens == [3, 4, 5, 1, 2] and drafted.judged is None


def test_every_steps_kept_tokens_reach_the_lookup() -> None:
    """The suffix store learns every step's kept tokens, whichever source drafted them, or none."""
    lookup = ScriptedLookup(everywhere=[4, 5])
    planner = Planner(lookup, ScriptedModel([6, 7]))
    for source, tokens in (("model", 3), ("ngram", 6), (None, 1)):
        planner.observe(Draft(), StepEvent(tokens - 1, tokens - 1, 0.0, 0.1, 0.0, source), [0] * tokens, FixedK(1))
    assert lookup.kept_steps == [[0] * 3, [0] * 6, [0]]


def test_the_planner_lets_the_lookup_take_a_model_draft_over_only_on_the_estimates() -> None:
    """The context's last token (2) never occurred before: no lookup draft. The model's first token (7)
    did, followed by 4 5: from there the lookup continues, if its rate is at least that of more model
    tokens; and it drops what it took in of the model's tokens again. Under a fixed K, nothing takes over."""
    context = [7, 4, 5, 1, 2]
    rates = {"model": 1.0, "ngram:1-2/once": 2.0}
    lookup = NgramLookup()
    planner = Planner(lookup, ScriptedModel([7, 8, 9]))
    planner.sync(context)
    lengths = lambda key, available, catch_up: min(available, 3)  # noqa: E731
    draft = propose(planner, request(context, length_for=lengths, best_rate=lambda key, available, catch_up: rates[key]))
    assert draft.tokens == [7, 4, 5, 1] and draft.continuation.tokens == [4, 5, 1] and draft.continuation.key == "ngram:1-2/once"
    assert lookup.match(context, 16) is None  # its index holds the context only
    rates["ngram:1-2/once"] = 0.5
    assert propose(planner, request(context, length_for=lengths, best_rate=lambda key, available, catch_up: rates[key])).tokens == [7, 8, 9]
    assert propose(planner, request(context, length_for=lengths)).tokens == [7, 8, 9]


def test_the_planner_under_a_fixed_k_drafts_from_the_first_source_that_proposes() -> None:
    lookup, model = ScriptedLookup(), ScriptedModel([6, 7])
    planner = Planner(lookup, model)
    assert propose(planner, request([1])).source == "model"  # no match: the model
    lookup.everywhere = [4, 5]
    assert propose(planner, request([1])).tokens == [4, 5]  # a match: the lookup's, all of it
    assert planner.name == "ngram+model"
    planner.forget(3)
    assert lookup.forgotten[-1] == model.forgotten[-1] == 3
    assert planner.costs([1]) == {"model": DraftCosts(0.5, {})}


# --- K policies -------------------------------------------------------------------------------------


def drafted_by(key: str, tokens: int, plan: Plan = NO_PLAN, catch_up_tokens: int = 0, **fields) -> Draft:
    """A draft of `tokens` tokens of `key`, made on `plan` (NO_PLAN: a step learnt, not asked), with
    these other fields of its segment."""
    return Draft((Segment(key, key, [0] * tokens, plan, **fields),), catch_up_tokens=catch_up_tokens)


def judged_only(key: str, tokens: list[int]) -> Draft:
    """No tokens verified, and a lookup's proposal of kind `key` to judge against what the step yields."""
    return Draft(judged=Segment(key.split(":")[0], key, tokens))


def step(drafted: int, accepted: int, draft_seconds: float = 0.0, target_seconds: float = 0.01) -> StepEvent:
    return StepEvent(drafted, accepted, draft_seconds, target_seconds, 0.0, "x")


def observe(policy: AutoK, draft: Draft, step: StepEvent) -> None:
    policy.observe(draft, step, [0] * (step.accepted + 1))


def ask(policy: AutoK, key: str, available: int, kept=lambda k: 0, token_cost: float = 0.0, catch_up: int = 0) -> int:
    """One step that asks `key` for a draft, as a source does: it drafts what the plan says and the
    first kept(k) tokens are kept (a plain step where the plan is 0), timed as calibrated. Returns k."""
    plan = policy.plan(key, available, catch_up)
    observe(policy, drafted_by(key, plan.k, plan), step(plan.k, kept(plan.k), plan.k * 0.025 * token_cost, policy.verify(plan.k + 1)))
    return plan.k


def test_fixed_k_drafts_k_unless_less_is_available() -> None:
    assert FixedK(4).plan("model", 10) == Plan(4) and FixedK(4).plan("ngram:1-2", 2) == Plan(2)


# Verify cost curves measured on this kind of CPU (single-token decodes per n-token verify).
COMPUTE_BOUND = {1: 1.0, 2: 1.42, 4: 2.2, 8: 3.5, 16: 4.0, 32: 7.3}  # Qwen2.5 1.5B Q4_K_M
MEMORY_BOUND = {1: 1.0, 2: 1.06, 4: 1.14, 8: 1.25, 16: 1.39, 32: 1.9}  # Gemma 3 270M F32
QWEN_PROFILED = {1: 1.0, 2: 1.44, 3: 1.87, 4: 1.62, 5: 2.02, 8: 2.92, 16: 3.43, 32: 6.4}  # one bench run's profile
GEMMA_PROFILED = {1: 1.0, 2: 1.24, 4: 1.52, 8: 1.83, 16: 2.55}  # Gemma F32's, in this version's runs
STEEP = {1: 1.0, 2: 1.72, 4: 2.79, 8: 4.57, 16: 5.19, 32: 7.3}  # Qwen 1.5B's on an idle CPU, a row per token
# Qwen 1.5B Q4_K_M's on a 2-core AMD EPYC, at the sizes `auto` profiles: 16 rows far cheaper than 15 (8.5
# against 10.9 plain steps: llama.cpp's CPU kernels work in tiles of rows), 25 rows 14.6.
TILED = {1: 1.0, 2: 1.75, 4: 3.09, 8: 7.43, 16: 8.54, 25: 14.57}


def calibrated(curve: dict[int, float], costs: dict[str, float]) -> AutoK:
    policy = AutoK()
    policy.calibrate(CostProfile({n: 0.025 * units for n, units in curve.items()}, {k: DraftCosts(0.025 * c, {}) for k, c in costs.items()}))
    return policy


def learn(policy: AutoK, key: str, drafted: int, accepted: int, times: int, token_cost: float = 0.0) -> None:
    """`times` steps of `key` drafting `drafted` tokens and keeping `accepted`, timed as calibrated."""
    for _ in range(times):
        observe(policy, drafted_by(key, drafted), step(drafted, accepted, drafted * 0.025 * token_cost, policy.verify(drafted + 1)))


def test_auto_never_drafts_with_a_model_that_cannot_pay() -> None:
    """Qwen on this CPU: a 0.68-cost draft, a compute-bound verify and acceptance ~0.85 lose at every K."""
    policy = calibrated(COMPUTE_BOUND, {"model": 0.68})
    for accepted in [4, 3, 4, 2, 4, 4, 1, 4, 3, 4] * 3:
        learn(policy, "model", 4, accepted, 1, token_cost=0.68)
    # A re-check (every draft kept would pay at K=15 on this curve) keeps 2 of 2.
    chosen = [ask(policy, "model", 16, kept=lambda k: k, token_cost=0.68) for _ in range(500)]
    assert sum(1 for k in chosen if k) <= 5, "re-checks must become ever rarer"


def test_auto_drafts_long_with_a_good_cheap_draft_on_a_flat_verify_curve() -> None:
    """Gemma F32 target, its own Q4_K_M as draft (c ~ 0.55, acceptance ~ 0.99)."""
    policy = calibrated(MEMORY_BOUND, {"model": 0.55})
    learn(policy, "model", 8, 8, 30, token_cost=0.55)
    assert policy.plan("model", 16).k >= 6


def test_auto_stops_drafting_a_source_that_is_always_rejected() -> None:
    policy = calibrated(MEMORY_BOUND, {"model": 0.55})
    assert ask(policy, "model", 8, token_cost=0.55) > 0  # optimistic before it has seen anything
    learn(policy, "model", 2, 0, 30, token_cost=0.55)
    assert policy.plan("model", 8).k == 0


def test_auto_prices_a_draft_models_catch_up_into_the_step_that_drafts() -> None:
    """Qwen's 0.5B draft on this CPU: a token 0.49 of a target step; taking in 2 tokens it skipped costs
    about a draft token, 16 about four (measured). A draft that pays a little when the model has kept up
    does not pay after it missed 19 tokens."""
    policy = AutoK()
    token = 0.49 * 0.025
    policy.calibrate(CostProfile({n: 0.025 * units for n, units in COMPUTE_BOUND.items()}, {"model": DraftCosts(token, {2: token, 16: 4 * token})}))
    model = policy.keys["model"].cost
    assert model.catch_up_fixed == pytest.approx(token * 8 / 14) and model.catch_up_per_token == pytest.approx(token * 3 / 14)
    learn(policy, "model", 4, 3, 12, token_cost=0.49)  # 3 of 4 kept: drafting pays a little
    assert ask(policy, "model", 16, kept=lambda k: 3 * k // 4, token_cost=0.49) > 0
    assert policy.plan("model", 16, 19).rate < policy.plan("model", 16, 0).rate
    assert policy.plan("model", 16, 19).k == 0
    # A catch-up measured at twice the line moves the line a TIMING_WEIGHT of the way up.
    seconds = (model.catch_up_fixed + 10 * model.catch_up_per_token) * policy.verify.level
    before = model.catch_up_per_token
    observe(policy, drafted_by("model", 2, catch_up_tokens=10), replace(step(2, 2, token * 2), catch_up_seconds=2 * seconds))
    assert model.catch_up_per_token == pytest.approx(before * (1 + TIMING_WEIGHT))


def test_the_planner_weighs_the_model_with_what_it_must_catch_up_on() -> None:
    model = ScriptedModel([6, 7])
    model.behind = 5
    chain = Planner(ScriptedLookup(everywhere=[4]), model)
    rates = {("ngram:3-5/once", 0): 1.2, ("model", 0): 1.5, ("model", 5): 1.1}
    assert propose(chain, request([1], best_rate=lambda key, available, catch_up: rates[key, catch_up])).source == "ngram"
    model.behind, model.owed = 0, 30
    weighing = request([1], best_rate=lambda key, available, catch_up: rates[key, catch_up])
    assert propose(chain, weighing).source == "model" and 30 in weighing.policy.owed_prompts


def test_auto_drafts_long_ngram_matches_even_on_a_compute_bound_target() -> None:
    policy = calibrated(COMPUTE_BOUND, {})
    learn(policy, "ngram:12+", 16, 16, 20)
    assert policy.plan("ngram:12+", 32).k >= 8
    assert policy.plan("ngram:12+", 32).rate > 1.5 * policy.plan("ngram:12+", 0).rate  # 0: the target alone


def test_auto_follows_a_drop_in_acceptance_within_tens_of_steps() -> None:
    """A draft that was always kept (code) and then always rejected (prose): without forgetting, 100
    kept steps would keep it drafting for some 200 failing ones. Here drafting gains much (a GPU's
    costs), so the memory is the longer one: 22 failing steps, 12 with the short one."""
    policy = calibrated(MEMORY_BOUND, {"model": 0.3})
    assert policy.keys["model"].acceptance.recency == LONG_RECENCY
    learn(policy, "model", 4, 4, 100, token_cost=0.3)
    failing_steps = 0
    while ask(policy, "model", 16, token_cost=0.3) and failing_steps < 300:
        failing_steps += 1
    assert failing_steps <= 25


@pytest.mark.parametrize(
    ("curve", "start", "after_a_copy", "after_a_miss"),
    [(MEMORY_BOUND, 24, 24, 24), (GEMMA_PROFILED, 8, 24, 8), (QWEN_PROFILED, RAMP_START, 23, 3)],
)
def test_a_lookup_starts_each_reply_as_long_as_a_draft_costing_one_more_plain_step(curve, start, after_a_copy, after_a_miss) -> None:
    """A lookup starts each reply at the longest draft whose verify costs at most twice a plain step, or
    at RAMP_START where that is shorter (Qwen's profile: 3), grows to twice what its last draft kept,
    drafts as long as its estimates choose once a draft was kept whole, up to the longest whose failure
    costs at most 1 + 3 plain steps more than a plain step after a copy of 3 (Qwen's profile: 23), and
    after a draft that kept nothing drafts the best length within its start again (on Qwen's profile 3,
    whose verify costs less than 4's). On a flat curve the start is the longest draft `auto` makes."""
    policy = calibrated(curve, {})
    learn(policy, "ngram:12+", 24, 24, 30, token_cost=0.0004)
    policy.begin_reply()
    if start > RAMP_START:
        assert policy.verify(start + 1) <= 2 * policy.verify(1)
        assert start == 24 or policy.verify(start + 2) > 2 * policy.verify(1)
    assert policy.plan("ngram:12+", 24).k == start
    learn(policy, "ngram:12+", start, start - 1, 1, token_cost=0.0004)  # its last token missed
    assert policy.plan("ngram:12+", 24).k == min(max(start, 2 * (start - 1)), 24)
    learn(policy, "ngram:12+", 3, 3, 1, token_cost=0.0004)  # kept whole: its estimates choose from here
    assert policy.plan("ngram:12+", 24).k == after_a_copy
    learn(policy, "ngram:12+", 24, 0, 1, token_cost=0.0004)
    assert policy.plan("ngram:12+", 24).k == after_a_miss


def test_a_lookup_kept_whole_risks_as_many_plain_steps_as_its_copy_has_kept() -> None:
    """On the tiled curve a key that copied long texts before, kept whole for 3 tokens in this reply, had
    its estimates choose 15 tokens at once (16 rows are cheap there), and on an agent's replies such drafts
    kept 1 or 2: 7.5 plain steps lost each. While its drafts are kept whole, the next one's complete
    failure may cost at most one plain step more than a plain step per token they kept, plus one: after
    3 tokens at most twice those (6), then longer as the copy goes on. On a flat curve 3 allow the longest."""

    def copied_three(curve: dict[int, float]) -> AutoK:
        policy = calibrated(curve, {})
        learn(policy, "ngram:12+", 24, 24, 30, token_cost=0.0004)  # it copied long texts before
        policy.begin_reply()
        assert ask(policy, "ngram:12+", 3, kept=lambda k: k) == 3  # a match 3 tokens from the reply's limit
        return policy

    assert copied_three(MEMORY_BOUND).plan("ngram:12+", 24).k == 24
    policy = copied_three(TILED)
    lengths = [ask(policy, "ngram:12+", 24, kept=lambda k: k, token_cost=0.0004) for _ in range(4)]
    assert 0 < lengths[0] <= 6 and lengths[-1] == 15, lengths
    failure = lambda k: policy.verify(k + 1) - policy.verify(1)  # noqa: E731
    assert failure(lengths[1]) <= (1 + 3 + lengths[0]) * policy.verify(1) < failure(15)  # earned, not assumed
    learn(policy, "ngram:12+", 15, 14, 1, token_cost=0.0004)  # not kept whole: the copy ends
    learn(policy, "ngram:12+", 3, 3, 1, token_cost=0.0004)  # a new one, 3 tokens so far
    assert policy.plan("ngram:12+", 24).k <= 6


def test_a_lookup_makes_a_plain_step_where_only_a_draft_past_its_ramp_would_pay() -> None:
    """Qwen 1.5B on an idle CPU, every verified row's logits: 2 rows cost 1.72 plain steps, 4 rows 2.79.
    A key that kept 3 of 5 first tokens, its deeper positions never judged (taken at the continuation
    rate), expects a 15-token draft to pay and every length up to its ramp's start (4) to lose. It
    makes a plain step, not a losing draft of the ramp's length."""
    policy = calibrated(STEEP, {})
    for accepted in (1, 0, 1, 0, 1):
        learn(policy, "ngram:1-2/once", 1, accepted, 1)
    policy.begin_reply()
    assert policy.verify(RAMP_START + 2) > 2 * policy.verify(1)  # so the lookup's ramp starts at RAMP_START
    first, continuation = policy.keys["ngram:1-2/once"].acceptance.rates(2)
    expected = [(1 + first * sum(continuation**i for i in range(k))) / policy.verify(k + 1) for k in range(25)]
    best = max(range(25), key=expected.__getitem__)
    assert best > RAMP_START and expected[best] > expected[0]  # a long draft would pay (15 tokens)...
    assert all(rate < expected[0] for rate in expected[1 : RAMP_START + 1])  # ...none the ramp allows
    assert policy.plan("ngram:1-2/once", 24).k == 0


def test_auto_earns_long_drafts_again_in_each_reply() -> None:
    """Measured on Gemma: a summary after code began with a 22-token draft chosen from the code's
    acceptance, and kept 2 of it; a table reply began with a 21-token lookup that kept 2, then 11 that
    kept none. A new reply starts a draft model at RAMP_START tokens and lets it draft at most twice
    what its last draft kept; after a draft that kept nothing, one token (where that pays). A lookup's
    ramp is priced on the verify curve (the next test): on this flat one it allows the longest draft."""
    policy = calibrated(MEMORY_BOUND, {"model": 0.55})
    learn(policy, "model", 16, 16, 30, token_cost=0.55)
    learn(policy, "ngram:12+", 16, 16, 30, token_cost=0.0004)  # a lookup takes microseconds, not nothing
    assert policy.plan("model", 24).k == 24  # within the reply that earned them, long drafts go on
    assert policy.plan("ngram:12+", 24).k == 24
    rate_earned = policy.plan("model", 24).rate
    policy.begin_reply()
    assert policy.plan("model", 24).rate < rate_earned  # a chain weighs the model's ramped draft
    lengths = [ask(policy, "model", 24, kept=lambda k: k, token_cost=0.55) for _ in range(3)]
    assert lengths == [RAMP_START, 2 * RAMP_START, 4 * RAMP_START]
    ask(policy, "model", 24, kept=lambda k: 3, token_cost=0.55)
    assert policy.plan("model", 24).k <= 6  # a long draft that kept 3: twice that, at most
    learn(policy, "model", 6, 0, 1, token_cost=0.55)
    assert policy.plan("model", 24).k == 1  # one that kept nothing: one token next, not RAMP_START
    assert policy.plan("ngram:12+", 24).k == 24
    learn(policy, "model", 1, 1, 1, token_cost=0.55)
    assert policy.plan("model", 24).k == 2


def test_a_draft_models_ramp_starts_each_reply_at_ramp_start_unless_drafting_gains_much() -> None:
    """On a CPU's curve a reply's first model draft is RAMP_START tokens, and after a miss twice what the
    draft kept. Where drafting gains much (a GPU: a draft token 0.05 of a target step, 17 rows 1.16
    steps) it is unramped: the estimates' best from the first step, and a miss cuts it only as far as
    the estimates fall."""
    gpu_like = {1: 1.0, 2: 1.01, 4: 1.03, 8: 1.07, 16: 1.15, 32: 1.31}
    for curve, token_cost, first, after_a_miss in ((gpu_like, 0.05, 24, range(9, 25)), (GEMMA_PROFILED, 0.5, RAMP_START, [4])):
        policy = calibrated(curve, {"model": token_cost})
        learn(policy, "model", 8, 8, 30, token_cost=token_cost)
        policy.begin_reply()
        assert ask(policy, "model", 24, kept=lambda k: 2, token_cost=token_cost) == first
        assert policy.plan("model", 24).k in after_a_miss


def test_auto_cut_back_ramp_drafts_the_shortest_length_that_pays_and_never_ends_drafting() -> None:
    """After a draft that kept nothing the ramp allows one token. Where that pays, one is drafted; where
    it does not (a compute-bound target: a draft decode and a 2-row verify for under two tokens), the
    shortest length that pays up to RAMP_START, or RAMP_START where none does: never nothing for the
    rest of the reply just because the ramp was cut."""
    chosen = {}
    for good_steps in (10, 4):
        policy = calibrated(COMPUTE_BOUND, {"model": 0.43})
        learn(policy, "model", 4, 4, good_steps, token_cost=0.43)
        policy.begin_reply()
        assert ask(policy, "model", 16, token_cost=0.43) == RAMP_START  # and it keeps nothing
        model = policy.keys["model"]
        one_token = (1 + model.acceptance.rates(1)[0]) / (model.cost.token_seconds * policy.verify.level + policy.verify(2))
        chosen[good_steps] = (one_token > 1 / policy.verify(1), policy.plan("model", 16).k)
    assert chosen[10] == (True, 1)  # a long good run before the failure: one token pays
    assert chosen[4] == (False, RAMP_START)  # a short one: no length up to RAMP_START pays, yet it drafts


def test_auto_grows_an_always_kept_lookup_past_a_step_in_the_verify_curve() -> None:
    """Measured in a run on Qwen 1.5B here: 4 rows cost what 3 do, 8 rows twice that. A 12+-token match
    kept in full at K=3 twenty times must be tried deeper, not held at 3 by the cheap step below 4."""
    policy = calibrated({1: 1.0, 2: 1.35, 3: 1.76, 4: 1.77, 8: 3.42, 16: 6.24, 32: 6.47}, {})
    learn(policy, "ngram:12+", 3, 3, 20)
    assert policy.plan("ngram:12+", 32).k > 3


def test_auto_judges_a_proposal_it_did_not_verify_against_what_the_step_yielded() -> None:
    policy = AutoK()
    for yielded in ([5, 6, 9], [5], [4, 6, 7]):  # two kept; a plain step's one token, kept; the first rejected
        policy.observe(judged_only("ngram:3-5", [5, 6, 7]), step(len(yielded) - 1, len(yielded) - 1), yielded)
    acceptance = policy.keys["ngram:3-5"].acceptance
    # Each step weighs the ones before it by RECENCY (0.9).
    assert acceptance.judged_at == pytest.approx([0.81 + 0.9 + 1, 0.81, 0.81])
    assert acceptance.kept_at == pytest.approx([0.81 + 0.9, 0.81, 0])


def test_auto_follows_a_lookup_it_does_not_draft_through_its_unverified_proposals() -> None:
    """A lookup ruled out by failed drafts comes back as soon as its proposals start matching what the
    target yields (a reply starts copying), long before a re-check is due; and one whose proposals keep
    missing is ruled out without drafting them (prose after a copied passage)."""
    policy = calibrated(COMPUTE_BOUND, {})
    learn(policy, "ngram:3-5", 3, 0, 20)
    assert policy.plan("ngram:3-5", 8).k == 0
    copying = judged_only("ngram:3-5", [1, 2, 3, 4])
    came_back_after = None
    for steps in range(1, 6):
        policy.observe(copying, step(1, 1), [1, 2])  # a model draft kept one, the target yielded one more
        if (plan := policy.plan("ngram:3-5", 8)).k:
            came_back_after = steps
            break
    assert came_back_after is not None and not plan.probe  # not a re-check: its estimate
    fresh = calibrated(COMPUTE_BOUND, {})
    learn(fresh, "ngram:3-5", 3, 3, 10)
    assert fresh.plan("ngram:3-5", 8).k > 0
    for _ in range(15):  # plain steps whose token the lookup got wrong (ten kept drafts fade by then)
        fresh.observe(copying, step(0, 0), [7])
    assert fresh.plan("ngram:3-5", 8).k == 0


def test_a_reply_whose_lookup_proposals_fail_scales_every_kind_of_match_down_until_the_next_reply() -> None:
    """Qwen's story: short matches of every kind, kept about half the time on the earlier replies, keep
    nothing in this prose. Proposals of other kinds that missed their first token (drafted, or judged
    undrafted) scale this kind's first-token estimate down before its own first draft in the
    reply, so it is not drafted; a new reply starts from the estimates again."""
    qwen = {1: 1.0, 2: 1.48, 4: 1.59, 8: 3.15, 16: 4.08}
    policy = calibrated(qwen, {})
    for key in ("ngram:1-2/once", "ngram:3-5/once", "ngram:1-2/varied"):
        for accepted in (3, 0) * 5:
            learn(policy, key, 3, accepted, 1)
    policy.begin_reply()
    assert policy.plan("ngram:1-2/once", 8).k > 0
    for _ in range(2):
        learn(policy, "ngram:3-5/once", 3, 0, 1)
        policy.observe(judged_only("ngram:1-2/varied", [1, 2]), step(0, 0), [7])
        assert policy.plan("ngram:1-2/once", 8).k > 0  # the scale counts from PRIOR_WEIGHT kept as expected
    learn(policy, "ngram:3-5/once", 3, 0, 1)
    assert policy.plan("ngram:1-2/once", 8).k == 0
    policy.begin_reply()
    assert policy.plan("ngram:1-2/once", 8).k > 0


def test_auto_probes_a_ruled_out_source_only_when_drafting_could_pay() -> None:
    cheap = calibrated(COMPUTE_BOUND, {})
    learn(cheap, "ngram:1-2", 2, 0, 30, token_cost=0.0004)  # a lookup takes microseconds: still no draft model
    # Each re-check fails too.
    probes = [index for index in range(500) if ask(cheap, "ngram:1-2", 8, token_cost=0.0004)]
    gaps = np.diff(probes)
    assert len(probes) >= 3 and all(later > earlier for earlier, later in zip(gaps, gaps[1:])), probes
    costly = calibrated(COMPUTE_BOUND, {"model": 0.68})
    learn(costly, "model", 2, 0, 30, token_cost=0.68)
    assert all(ask(costly, "model", 2) == 0 for _ in range(300))  # at most 2: not even kept drafts pay


def gemma_costs() -> AutoK:
    """Gemma's Q4_K_M draft for its F32 target: a token half a target step, taking in m tokens 0.23 +
    0.097 m steps."""
    policy = AutoK()
    curve = {n: 0.025 * units for n, units in GEMMA_PROFILED.items()}
    policy.calibrate(CostProfile(curve, {"model": DraftCosts(0.025 * 0.5, {2: 0.025 * 0.42, 16: 0.025 * 1.78})}))
    return policy


def test_a_draft_model_is_re_checked_only_where_it_holds_the_context() -> None:
    """In a chain, a reply may first ask the draft model after the lookup has drafted dozens of tokens
    that the model must take in first (Gemma's Q4_K_M: 0.23 + 0.097 steps a token) for a 2-token draft:
    it waits for a reply that asks the model where it holds the context (Gemma's chain replayed at 128
    tokens: `rewrite` 3.42 -> 3.83, the eight tasks 2.60 -> 2.68; tests/benchmarks/RESULTS.md). A model
    never measured is tried where first asked, or a chain whose lookup starts every reply never would."""
    policy = gemma_costs()
    learn(policy, "model", 4, 0, 30, token_cost=0.5)  # ruled out
    policy.begin_reply()
    policy.begin_reply()  # a reply later: a re-check is due where the reply first asks the model
    assert policy.plan("model", 16).probe
    assert policy.plan("model", 16, catch_up=40).k == 0
    # Never measured (a new server whose first replies the lookup starts): tried where first asked.
    assert gemma_costs().plan("model", 16, catch_up=40).k > 0


def reply_of(policy: AutoK, steps: list[tuple[str, int]]) -> None:
    """A reply of these steps: (source, tokens drafted), each kept whole."""
    policy.begin_reply()
    for key, drafted in steps:
        learn(policy, key, drafted, drafted, 1, token_cost=0.5 if key == "model" else 0.0)


def test_auto_spreads_a_draft_models_prompt_over_what_its_drafts_are_expected_to_yield() -> None:
    """The 80 prompt tokens a draft model takes in at its first draft of a reply (8 steps at Gemma's
    costs) cost once: with 128 tokens of reply ahead, drafts it keeps whole pay for them; after replies
    of 8 tokens they would not, and there the model drafts only where it holds the prompt already. The
    tokens its drafts yield are what it shares the reply with other sources: yielding half the tokens of
    replies as long, it is expected to pay for half as much (RESULTS.md, "The prompt's intake priced")."""
    policy = gemma_costs()
    learn(policy, "model", 8, 8, 12, token_cost=0.5)
    owing, holding = policy.plan("model", 127, owed_prompt=80), policy.plan("model", 127)
    assert owing.k > 0 and owing.rate < holding.rate
    for _ in range(MEMORY):
        reply_of(policy, [("model", 7)])  # 8 tokens each
    policy.begin_reply()
    assert policy.plan("model", 127, owed_prompt=80).k == 0 and policy.plan("model", 127).k > 0
    shared, alone = gemma_costs(), gemma_costs()
    for replying, steps in ((shared, [("model", 7), ("ngram:1-2", 7)] * 2), (alone, [("model", 7)] * 4)):
        for _ in range(3):
            reply_of(replying, steps)  # 32 tokens each
        replying.begin_reply()

    def seconds_per_token_of_the_prompt(replying: AutoK) -> float:
        return 1 / replying.plan("model", 127, owed_prompt=40).rate - 1 / replying.plan("model", 127).rate

    # Its share of the tokens moved from 1 towards 1/2 by 1 - RECENCY a reply: the prompt is spread over
    # that share of the tokens.
    share = 1 / 2 + (1 - 1 / 2) * RECENCY ** 3
    assert seconds_per_token_of_the_prompt(shared) / seconds_per_token_of_the_prompt(alone) == pytest.approx(1 / share)


def test_a_draft_model_is_re_checked_only_where_its_share_of_the_prompt_it_lacks_is_cheap() -> None:
    """A re-check measures a draft model its estimates rule out, with a 2-token draft, and takes in the
    prompt first: after replies of 16 tokens, 80 prompt tokens (8 steps at Gemma's costs) are 1.5 steps
    for its 3 tokens, 5 prompt tokens 0.13 of one. Where its drafts would pay and only its prompt
    keeps it out (48 tokens, for drafts that keep 6 of 8), a re-check would pay for the prompt to learn
    nothing. (Qwen's bench tasks replayed with the prompt charged: 1.12 -> 1.30 -> 1.40, RESULTS.md,
    "The prompt's intake priced".)"""
    pays, fails = gemma_costs(), gemma_costs()
    learn(pays, "model", 8, 6, 12, token_cost=0.5)
    learn(fails, "model", 4, 0, 30, token_cost=0.5)
    for policy in (pays, fails):
        for _ in range(MEMORY):
            reply_of(policy, [("ngram:1-2", 15)])  # 16 tokens each
        policy.begin_reply()
    assert fails.plan("model", 63, owed_prompt=5).probe and not fails.plan("model", 63, owed_prompt=80).probe
    assert pays.plan("model", 63).k > 0
    assert pays.plan("model", 63, owed_prompt=48).k == 0 and not pays.plan("model", 63, owed_prompt=48).probe


def test_a_plan_is_not_an_ask_only_an_observed_draft_counts() -> None:
    """While a draft model drafts 8 tokens, a chain asks the lookup after each whether it takes over.
    Counted as asks, those once brought a ruled-out lookup key's re-check due after two target steps.
    A plan changes nothing: only the step's own draft, observed, counts."""
    policy = calibrated(COMPUTE_BOUND, {})
    learn(policy, "ngram:1-2", 2, 0, 30, token_cost=0.0004)
    for _ in range(FIRST_PROBE_AFTER):  # steps the model drafted, the lookup asked 7 times in each
        assert [policy.plan("ngram:1-2", 8) for _ in range(7)] == [policy.plan("ngram:1-2", 8)] * 7
        assert ask(policy, "ngram:1-2", 8) == 0  # the step's own ask
    plan = policy.plan("ngram:1-2", 8)
    assert plan.k == 2 and plan.probe  # due after FIRST_PROBE_AFTER idle steps


def test_auto_re_checks_a_ruled_out_draft_model_where_what_it_skipped_is_cheap_to_take_in() -> None:
    """A draft model ruled out is re-checked where a reply first asks it, every 1, 2, 4, 8 replies while
    its re-checks fail (a chat that turns to code must find its draft model again), and within a reply
    after FIRST_PROBE_AFTER idle steps, doubling, where the tokens it must first take in cost at most
    RAMP_LOSS plain steps. Qwen 0.5B on this CPU (a sixth of the target's step a skipped token) never
    is mid-reply; on the H200 a draft model ruled out by two misses in a row came back only so
    (docs/gpu.md: `auto` at 0.80 of the best fixed K before)."""
    def probes(catch_up_token_cost: float) -> list[tuple[int, int]]:
        policy = AutoK()
        policy.calibrate(CostProfile(
            {n: 0.025 * units for n, units in COMPUTE_BOUND.items()},
            {"model": DraftCosts(0.025 * 0.3, {2: 0.025 * 2 * catch_up_token_cost, 24: 0.025 * 24 * catch_up_token_cost})},
        ))
        learn(policy, "model", 4, 0, 30, token_cost=0.3)
        found = []
        for reply in range(40):
            policy.begin_reply()
            for index in range(100):
                plan = policy.plan("model", 16, index)  # it has skipped every token of the reply so far
                if plan.k:
                    found.append((reply, index))
                ask(policy, "model", 16, token_cost=0.3, catch_up=index)  # the re-check fails
        return found

    expensive = probes(1 / 6)
    assert {index for _, index in expensive} == {0}, expensive
    gaps = np.diff([reply for reply, _ in expensive]).tolist()
    assert gaps[:3] == [2, 4, 8] and set(gaps[3:]) == {MEMORY}, expensive  # ever rarer, up to a bound
    cheap = probes(0.01)
    mid_reply = [index for reply, index in cheap if index and not reply]
    # After the first ask's re-check failed: FIRST_PROBE_AFTER idle steps doubled once, then twice more.
    first = 2 * FIRST_PROBE_AFTER + 1
    assert mid_reply == [first, first + 4 * FIRST_PROBE_AFTER + 1], cheap


def test_auto_does_not_price_again_a_draft_model_that_drafted_nothing_last_step(monkeypatch) -> None:
    """On a launch-bound pair (a 0.3 ms step) pricing 24 lengths every plain step cost `auto` about 5% of
    the target alone's speed where it drafted nothing. Once a draft model has declined a step, only what it
    skipped grows until it drafts again or a re-check is due and affordable, so it is not priced again."""
    policy = calibrated(COMPUTE_BOUND, {"model": 0.3})
    learn(policy, "model", 4, 0, 30, token_cost=0.3)  # ruled out
    priced = []
    rates = policy._rates
    monkeypatch.setattr(policy, "_rates", lambda *args: priced.append(1) or rates(*args))
    policy.begin_reply()
    assert ask(policy, "model", 16, token_cost=0.3) == 2  # the reply's first ask: a re-check, which fails
    priced.clear()
    for index in range(1, 2 * FIRST_PROBE_AFTER):
        assert ask(policy, "model", 16, token_cost=0.3, catch_up=index) == 0
    # Priced once, on the step after the re-check (it learnt from it), then not while idle: the next
    # re-check is due after 2 * FIRST_PROBE_AFTER idle steps.
    assert len(priced) == 1


H200 = {1: 1.0, 2: 1.38, 4: 1.56, 8: 1.66, 16: 1.82, 25: 1.77}  # the device check's pair (docs/gpu.md)


def test_a_draft_model_drafts_unramped_and_remembers_longer_where_drafting_gains_much() -> None:
    """On the H200's costs (at the prior's acceptance 6 tokens pay best, past RAMP_START) a draft model
    whose drafts are kept whole drafts the estimates' best length from a reply's first step, where a ramp
    (the control) starts each reply at RAMP_START, and its estimates weigh earlier drafts by LONG_RECENCY;
    on this CPU's Qwen and Gemma costs (3 and 4 tokens: Gemma's at the bound) it is ramped and its memory
    short."""
    h200 = calibrated(H200, {"model": 0.3}).keys["model"]
    assert h200.schedule.unramped and h200.acceptance.recency == LONG_RECENCY
    for curve in (QWEN_PROFILED, GEMMA_PROFILED):
        cpu = calibrated(curve, {"model": 0.48}).keys["model"]
        assert not cpu.schedule.unramped and cpu.acceptance.recency == RECENCY
    lengths = {}
    for unramped in (True, False):
        policy = calibrated(H200, {"model": 0.3})
        learn(policy, "model", 8, 8, 10, token_cost=0.3)
        policy.begin_reply()
        policy.keys["model"].schedule.unramped = unramped
        lengths[unramped] = policy.plan("model", 24).k
    assert lengths[True] > RAMP_START and lengths[False] == RAMP_START


def test_whether_a_draft_model_is_ramped_is_decided_from_the_profile_not_from_its_drafts() -> None:
    """On the H200 a draft's first decode costs more than the others, so the per-token cost learnt from
    short drafts is dear. Learnt from 1-token drafts at 0.6 a token, the model stays unramped in the next
    reply (decided from the profile's 0.3); the control: priced at what it learnt, it would be ramped,
    and a ramped model drafts short again, so short drafts would have kept it short (the device pair)."""
    policy = calibrated(H200, {"model": 0.3})
    learn(policy, "model", 1, 1, 40, token_cost=0.6)
    policy.begin_reply()
    assert policy.keys["model"].schedule.unramped
    learnt = policy.keys["model"].cost.token_seconds / 0.025
    assert learnt > 0.55 and not calibrated(H200, {"model": learnt}).keys["model"].schedule.unramped


def test_an_unramped_draft_model_kept_whole_drafts_a_token_further_next() -> None:
    """Unramped (the H200's costs), a draft model whose third tokens were rejected drafts 2 tokens; kept
    whole, its next draft is 3 tokens: only drafting there refreshes the stale estimate past them (the
    agent workload at the H200's costs drafted 2 tokens, each kept, for a whole reply). The control, the
    same state with the draft not kept whole, stays at 2."""
    lengths = {}
    for whole in (True, False):
        policy = calibrated(H200, {"model": 0.3})
        learn(policy, "model", 6, 2, 10, token_cost=0.3)
        assert policy.keys["model"].schedule.unramped and policy.plan("model", 24).k == 2
        ask(policy, "model", 24, kept=lambda k: k, token_cost=0.3)
        policy.keys["model"].schedule.last_kept_whole = whole
        lengths[whole] = policy.plan("model", 24).k
    assert lengths == {True: 3, False: 2}
    # Its own 2 tokens kept and a lookup's 12 after them: a token more than its own, not than the step's.
    policy = calibrated(H200, {"model": 0.3})
    learn(policy, "model", 6, 2, 10, token_cost=0.3)
    plan = policy.plan("model", 24)
    taken_over = Draft((Segment("model", "model", [0] * 2, plan), Segment("ngram", "ngram:12+/same", [0] * 12, Plan(12))))
    observe(policy, taken_over, step(14, 14, 0.0075 * 2, policy.verify(15)))
    state = policy.keys["model"]
    best_rate = max(policy._rates(state, state.acceptance.rates(24)))
    assert policy.plan("model", 24) == Plan(3, best_rate)  # its rate the estimates' best length's, not 3's


def test_auto_counts_a_reply_s_drafts_chosen_on_its_estimates_apart_from_its_re_checks() -> None:
    """Chat says `auto` found nothing worth drafting where a reply had only re-checks: they are counted
    apart from the drafts the estimates chose, per reply."""
    policy = calibrated(COMPUTE_BOUND, {"model": 0.3})
    policy.begin_reply()
    k = ask(policy, "model", 16, kept=lambda k: k, token_cost=0.3)  # nothing measured yet: the prior's estimates choose
    assert k and (policy.reply.chosen, policy.reply.rechecks) == (1, 0)
    learn(policy, "model", 4, 0, 30, token_cost=0.3)  # then ruled out
    policy.begin_reply()
    assert (policy.reply.chosen, policy.reply.rechecks) == (0, 0)
    k = ask(policy, "model", 16, token_cost=0.3)  # first asked in the reply: a re-check, which fails
    assert ask(policy, "model", 16) == 0  # nothing more in this reply; a plain step counts for neither
    assert k == 2 and (policy.reply.chosen, policy.reply.rechecks) == (0, 1)
    assert FixedK(4).reply is None  # a fixed K drafts what it is told: nothing to report


def test_auto_brings_back_a_ruled_out_draft_model_whose_re_check_is_kept() -> None:
    """Measured on Qwen: ruled out on prose, the draft model's 2-token re-checks on code were kept, yet
    could not outweigh the failed drafts before them, and K=4 paid 1.25-1.38x where `auto` drafted
    nothing. A re-check weighs the earlier evidence by a quarter: kept, it brings the key back."""
    policy = calibrated(QWEN_PROFILED, {"model": 0.45})

    def reply(kept) -> list[int]:
        policy.begin_reply()
        lengths = []
        for _ in range(12):
            lengths.append(ask(policy, "model", 16, kept=kept, token_cost=0.45))
        return lengths

    assert all(reply(lambda k: k))  # code: every draft kept
    for _ in range(3):  # prose: every draft rejected, the draft model ruled out (and re-checked once)
        reply(lambda k: 0)
    assert all(reply(lambda k: k))  # code again: the re-check is kept, and drafting resumes


def test_verify_costs_interpolate_and_extend_the_measured_points() -> None:
    costs = VerifyCosts({1: 1.0, 4: 2.5, 8: 3.0})
    assert costs(1) == 1.0 and costs(2) == pytest.approx(1.5) and costs(16) == pytest.approx(4.0)


def test_verify_costs_follow_load_at_every_size_and_refine_the_shape_where_measured() -> None:
    costs = VerifyCosts({1: 1.0, 4: 2.5, 8: 3.0})
    for _ in range(60):  # the machine runs 50% slower, and only one-row steps (plain decodes) measure it
        costs.update(1, 1.5, other_seconds=0.0)
    assert costs.decode(1) == pytest.approx(1.5, rel=0.01) and costs.decode(4) == pytest.approx(3.75, rel=0.01)
    costs.update(8, 1.2 * costs.decode(8), other_seconds=0.8)  # eight rows cost more than the shape said
    assert costs.decode(8) / costs.decode(1) > 3.0 and costs.per_row_seconds == pytest.approx(TIMING_WEIGHT * 0.1)
    before = costs.decode(8)
    costs.update(8, 100.0, other_seconds=0.0)  # a decode slowed by something else moves it a bounded step
    assert before < costs.decode(8) <= 1.36 * before


def test_verify_cost_curve_is_never_lower_for_more_rows() -> None:
    costs = VerifyCosts({1: 1.0, 2: 1.1, 3: 9.0, 4: 1.2, 8: 1.5})  # 3 rows timed while the machine was busy
    curve = [costs(n) for n in range(1, 9)]
    assert curve == sorted(curve) and costs(3) == pytest.approx(1.2)


# --- --spec and --k ---------------------------------------------------------------------------------


def test_spec_and_k_are_checked_with_one_clear_line() -> None:
    assert check_spec("ngram+model") == "ngram+model" and uses_draft_model("ngram+model")
    assert not uses_draft_model("ngram")
    with pytest.raises(SpeccliError, match=r"--spec must be one of ngram, suffix, model, ngram\+model, suffix\+model, got 'tree'"):
        check_spec("tree")
    with pytest.raises(SpeccliError, match="got 'ngram\\+suffix'"):  # suffix does the lookup's work already
        check_spec("ngram+suffix")
    assert check_spec("suffix+model") == "suffix+model" and uses_draft_model("suffix+model") and not uses_draft_model("suffix")
    assert parse_spec_list("ngram, model,ngram") == ["ngram", "model"]
    assert parse_k("auto") == "auto" and parse_k("8") == 8 and parse_k(3) == 3
    for bad in ["0", "65", "-1"]:
        with pytest.raises(SpeccliError, match=rf"--k \(draft tokens per step\) must be between 1 and 64, got {bad}$"):
            parse_k(bad)
    for bad, given in [("abc", "got 'abc'"), ("2.5", "got '2.5'"), ("", "and none was given")]:
        with pytest.raises(SpeccliError, match=rf"^--k needs 'auto' or a whole number from 1 to 64, {given}$"):
            parse_k(bad)
    assert parse_k_sweep("4,auto,1-2") == ["auto", 1, 2, 4]
    # A list that cannot be read is a usage error (exit 2) however it is malformed; a K out of range is not.
    for malformed in ["", " ", ",2", "2,", "x", "1-"]:
        with pytest.raises(WrongTypeError):
            parse_k_sweep(malformed)
    for out_of_range in ["0", "1-65", "4,65"]:
        with pytest.raises(SpeccliError) as raised:
            parse_k_sweep(out_of_range)
        assert raised.value.exit_code == 1, out_of_range
    with pytest.raises(SpeccliError, match="--spec model needs a draft model"):
        make_drafter("model", None, None)
    assert make_drafter("ngram", None, None).name == "ngram"


def folder_imports(package: Path) -> dict[str, set[str]]:
    """Which of speccli's folders (or top-level modules) each one imports, counting every import in a
    file: at the top, under TYPE_CHECKING or inside a function."""
    import ast

    def unit(module: str) -> str:
        return module.split(".")[1] if module.count(".") else module

    edges: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        here = unit(".".join(path.relative_to(package.parent).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                if name.startswith("speccli.") and unit(name) != here:
                    edges.setdefault(here, set()).add(unit(name))
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (each a circle of imports)."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for following in edges.get(todo.pop(), ()):
                if following not in seen:
                    seen.add(following)
                    todo.append(following)
        return seen

    reached = {node: reach(node) for node in edges}
    groups = {frozenset(n for n in reached if n in reached[node] and node in reached[n]) | {node} for node in edges}
    return sorted(sorted(group) for group in groups if len(group) > 1)


def test_no_circle_of_imports_spans_speccli_s_folders() -> None:
    """The data flow reads one way (llama -> core -> drafting -> chat, bench, server -> cli): a circle
    across folders is an arrow back up, and each coming capability would have to be threaded through it."""
    edges = folder_imports(Path(__file__).resolve().parents[1] / "speccli")
    assert "drafting" in edges["chat"] and "core" in edges["drafting"]  # the graph is read at all
    assert circles(edges) == []
    back_up = circles({**edges, "core": edges["core"] | {"drafting"}})  # an arrow back up is seen
    assert len(back_up) == 1 and {"core", "drafting"} <= set(back_up[0])


def test_the_engine_and_the_drafters_do_not_import_llama_cpp():
    """One package talks to llama.cpp (speccli.llama); the speculative loop, the draft sources and the
    K policy read as plain numpy and Python, and import without it."""
    modules = ["speccli.core.generator", "speccli.core.parting", "speccli.core.verify", "speccli.drafting.specs"]
    code = f"import sys; import {', '.join(modules)}; print(sorted(m for m in sys.modules if m.startswith('llama_cpp')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the libraries mapped into the process")
def test_importing_speccli_loads_llama_cpps_library_before_numpy_and_imports_neither():
    """With a GPU backend a model load crashed where numpy came first (speccli/llama/load_order.py);
    the command line still checks its options without importing llama_cpp or numpy."""
    code = ("import sys, speccli; mapped = open('/proc/self/maps').read(); "
            "print('numpy' in sys.modules, 'llama_cpp' in sys.modules, '/libllama.so' in mapped)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False", "True"]


def test_numpy_imported_before_speccli_is_warned_of_only_where_llama_cpp_has_a_gpu_backend(tmp_path):
    """This install is a CPU build: numpy first is fine, and no warning. A CUDA build cannot run here, so
    its layout stands in for it: a llama_cpp package whose lib/ holds libggml-cuda.so."""
    quiet = subprocess.run([sys.executable, "-W", "error", "-c", "import numpy, speccli"], capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stderr == ""
    (tmp_path / "llama_cpp" / "lib").mkdir(parents=True)
    (tmp_path / "llama_cpp" / "__init__.py").write_text("")
    (tmp_path / "llama_cpp" / "lib" / "libggml-cuda.so").write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])}
    warned = subprocess.run([sys.executable, "-c", "import numpy, speccli"], capture_output=True, text=True, env=env)
    assert warned.returncode == 0
    assert "numpy was imported before speccli: with llama.cpp's CUDA backend a model load may crash" in warned.stderr
    speccli_first = subprocess.run([sys.executable, "-W", "error", "-c", "import speccli, numpy"], capture_output=True, text=True, env=env)
    assert speccli_first.returncode == 0 and speccli_first.stderr == ""
