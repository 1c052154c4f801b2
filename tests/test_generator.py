"""The generation loop's bookkeeping on the numpy stand-in model (tests/standin.py), without llama.cpp:
caches rolled back to what was kept, max tokens, stop strings, ends of generation, a stop asked for
between steps, limits, chains and take-overs, the lookup's shadows; and exactness: the first two
tokens' joint distribution against the one the stand-in's table gives, with a broken rule that must
fail it. What depends on llama.cpp itself (context clamps, padding ids) is tested in test_engine.py,
on tiny real models, as are a full context and a prefill stopped between batches (here too)."""
from __future__ import annotations

import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from speccli.core import verify as verify_module
from speccli.core.generator import GenerationLimits, Generator, measure_costs
from speccli.core.sampling import SamplingParams
from speccli.core.seam import Plan
from speccli.core.stats import DoneEvent, RunStats, Source, StepEvent, TokenEvent
from speccli.drafting.planner import Planner
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramLookup
from speccli.drafting.policy import AutoK, FixedK
from speccli.errors import SpeccliError
from tests.conftest import MemoryBoundAutoK
from tests.standin import EOG, StandInModel, exact_two_token_distribution, related_draft, stand_in, stand_in_pair
from tests.token_distribution import chi_square_p_value
from tests.two_token_distribution import sampled_pairs_and_stats

GREEDY = SamplingParams(temperature=0)
SAMPLED = SamplingParams(temperature=0.9)
NEVER_ENDS = float("-inf")  # an eog_bias: the reply never ends by itself
CLOSE = 0.3  # a draft's noise at which it keeps several drafts in a row (the default, 1.0, keeps ~half)


def run(generator: Generator, prompt, stop_requested=lambda: False, **limits):
    events = list(generator.generate(prompt, GenerationLimits(**limits), stop_requested))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return [e for e in events if isinstance(e, TokenEvent)], [e for e in events if isinstance(e, StepEvent)], done


def draft_models(planner: Planner) -> list[StandInModel]:
    return [planner.model.model] if isinstance(planner.model, ModelDrafter) else []


def assert_caches_follow(generator: Generator) -> None:
    """The generator's invariant: each cache holds a prefix of its tokens, never the pending last one."""
    tokens = generator.tokens
    for model in [generator.target, *draft_models(generator.drafter)]:
        assert model.n_past <= len(tokens) - 1, f"{model.path} holds the pending token"
        assert model.held == tokens[: model.n_past], f"{model.path} holds tokens the generator took back"


class TakeOverFavouredK(FixedK):
    """K=3, with estimates that favour lookup drafts: a chain lets the lookup take a model draft over
    wherever it has a match."""

    def __init__(self) -> None:
        super().__init__(3)

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        return Plan(min(self.k, available), 2.0 if key.startswith("ngram") else 1.0)


DRAFTING = {
    "model-k4": lambda draft: (Planner(model=ModelDrafter(draft)), FixedK(4)),
    "ngram-k3": lambda draft: (Planner(NgramLookup()), FixedK(3)),
    "ngram+model-auto": lambda draft: (Planner(NgramLookup(), ModelDrafter(draft)), MemoryBoundAutoK()),
    "ngram+model-take-overs": lambda draft: (Planner(NgramLookup(), ModelDrafter(draft)), TakeOverFavouredK()),
}


def conversation(generator: Generator, turns: int = 4, max_tokens: int = 24, check=lambda generator: None):
    """A chat of `turns` replies, `check` run at every event; each reply's tokens and its figures. Each
    message quotes the start of the last reply (which a lookup then continues), but the third edits
    the first message instead."""
    tokenize = generator.target.tokenizer.tokenize
    prompt = tokenize("the cat sat on the mat. the cat")
    replies = []
    for turn in range(turns):
        tokens, figures = [], None
        for event in generator.generate(prompt, GenerationLimits(max_tokens=max_tokens)):
            check(generator)
            if isinstance(event, TokenEvent):
                tokens.append(event.token)
            elif isinstance(event, DoneEvent):
                figures = event.stats
        replies.append((tokens, figures))
        quote = [token for token in tokens if token != EOG][:8]
        prompt = prompt[:9] + tokenize(" dog ran.") if turn == 1 else generator.tokens + tokenize(" so ") + quote
    return replies


# --- the caches --------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafting", DRAFTING)
def test_every_cache_holds_a_prefix_of_the_tokens_and_never_the_pending_one(drafting, sampling) -> None:
    """At every event of a chat (replies that follow the last, one that edits an earlier message),
    whatever was drafted and rejected, whatever ended a reply."""
    target, draft = stand_in_pair(eog_bias=0.0)  # replies end by themselves too, at times
    drafter, policy = DRAFTING[drafting](draft)
    replies = conversation(Generator(target, drafter, sampling, policy, seed=7), check=assert_caches_follow)
    drafted, kept = sum(figures.drafted_counted for _, figures in replies), sum(figures.accepted for _, figures in replies)
    assert drafted > kept, "drafts should be rejected"
    # ...and kept, but for a lookup's in sampled text: it copies little of the stand-in's random text.
    assert kept > 0 or (drafting == "ngram-k3" and not sampling.greedy)


@pytest.mark.parametrize("drafting", DRAFTING)
def test_greedy_replies_equal_the_target_alones_turn_after_turn(drafting) -> None:
    target, draft = stand_in_pair(CLOSE)
    drafter, policy = DRAFTING[drafting](draft)
    speculative = conversation(Generator(target, drafter, GREEDY, policy))
    alone = conversation(Generator(stand_in(), None, GREEDY))
    assert [tokens for tokens, _ in speculative] == [tokens for tokens, _ in alone]
    assert sum(figures.accepted for _, figures in speculative) > 0
    if drafting.endswith("take-overs"):
        assert sum(figures.take_overs.get("ngram", 0) for _, figures in speculative) > 0


def test_a_second_call_decodes_only_the_new_tokens() -> None:
    target, draft = stand_in_pair()
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(4), seed=3)
    prompt = target.tokenizer.tokenize("the cat sat")
    run(generator, prompt, max_tokens=6)
    new_text = target.tokenizer.tokenize(" and then", add_special=False)
    follow_up = generator.tokens + new_text
    # What it reports as reused (chat's prefill count, serve's cached_tokens): not the previous reply's
    # last token, which no cache holds yet.
    assert generator.reused_prefix(follow_up) == len(generator.tokens) - 1
    decoded_before = target.decoded_tokens
    _, _, done = run(generator, follow_up, max_tokens=1)
    # Prefill: the previous reply's last token and the new text but its last token; then one step
    # decodes that last token and the drafts. Nothing from the first call is decoded again.
    assert done.stats.steps == 1
    assert target.decoded_tokens - decoded_before == len(new_text) + 1 + done.stats.drafted_counted


class NeverDrafts(FixedK):
    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        return Plan(0)


def test_a_draft_model_takes_in_a_prompt_only_in_a_reply_it_drafts_in_and_as_the_prefills_time() -> None:
    target, draft = stand_in_pair()
    prompt = target.tokenizer.tokenize("the cat sat on the mat and")
    run(Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, NeverDrafts(4), seed=3), prompt, max_tokens=6)
    assert draft.decoded_tokens == 0  # it owed the prompt, never drafted, and never paid for it
    _, steps, done = run(Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(4), seed=3), prompt, max_tokens=6)
    assert draft.decode_sizes[0] == (len(prompt) - 1, 0)  # at its first draft, before the draft's own decodes
    assert steps[0].prompt_seconds > 0 and not any(step.prompt_seconds for step in steps[1:])
    # Counted as the prefill's time, not the step's drafting.
    counted = RunStats()
    counted.add(replace(steps[0], prompt_seconds=0.25))
    assert counted.prefill_seconds == 0.25 and counted.draft_seconds == steps[0].draft_seconds


def test_reset_frees_the_rows_a_draft_model_drafted_into() -> None:
    """serve keeps a generator for each drafting configuration clients ask for (K up to 64), and resets
    the one it leaves: its K rows of probabilities must go with the reset (64 MiB at Gemma's vocabulary)."""
    target = stand_in(n_vocab=1024, n_states=256, eog_bias=NEVER_ENDS)
    draft = related_draft(target)
    k = 32
    row_bytes = k * draft.n_vocab * 4
    tracemalloc.start()
    try:
        generator = Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(k), seed=1)
        run(generator, target.tokenizer.tokenize("the cat sat"), max_tokens=k + 2)  # room for a K-token draft
        held = tracemalloc.get_traced_memory()[0]
        generator.reset()
        assert held - tracemalloc.get_traced_memory()[0] >= row_bytes
    finally:
        tracemalloc.stop()


# --- what ends a reply ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 2, 4, 5, 9])
def test_max_tokens_is_exact_and_no_step_drafts_more_than_the_reply_still_needs(max_tokens) -> None:
    target, draft = stand_in_pair(CLOSE, eog_bias=NEVER_ENDS)
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(4), seed=max_tokens)
    prompt = target.tokenizer.tokenize("a b c")
    tokens, steps, done = run(generator, prompt, max_tokens=max_tokens)
    assert done.reason == "max_tokens" and len(tokens) == done.stats.generated == max_tokens
    given = 0
    for step in steps:
        assert step.drafted <= max_tokens - given - 1
        given += step.accepted + 1
    # The sequence holds the prompt and exactly the tokens shown; no cache holds more.
    assert generator.tokens == prompt + [t.token for t in tokens]
    assert_caches_follow(generator)
    assert sum(step.drafted for step in steps) == done.stats.drafted_counted


def test_an_end_of_generation_ends_the_reply_unshown_and_drafts_kept_past_it_are_forgotten() -> None:
    target, draft = stand_in_pair(CLOSE, eog_bias=3.0)  # replies end after a few tokens
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(4), seed=11)
    prompt = target.tokenizer.tokenize("a b c")
    for _ in range(100):  # until the end of generation comes inside a step's kept drafts
        tokens, steps, done = run(generator, prompt, max_tokens=40)
        if done.reason == "eog" and steps[-1].used is not None:
            break
    else:
        raise AssertionError("no reply ended inside a step's kept drafts")
    # The end-of-generation token is kept last, but not shown; the drafts after it are forgotten.
    assert generator.tokens == prompt + [t.token for t in tokens] + [EOG]
    assert EOG not in [t.token for t in tokens] and len(tokens) == done.stats.generated
    assert steps[-1].used < steps[-1].accepted + 1
    assert done.stats.accepted <= len(tokens) + 1  # kept drafts never outnumber the tokens used
    assert_caches_follow(generator)
    follow_up = generator.tokens + target.tokenizer.tokenize(" d")
    assert generator.reused_prefix(follow_up) == len(generator.tokens) - 1  # a next turn goes on after it
    run(generator, follow_up, max_tokens=5)
    assert_caches_follow(generator)


def test_stop_string_ends_the_text_before_it() -> None:
    target, draft = stand_in_pair(eog_bias=NEVER_ENDS)
    prompt = target.tokenizer.tokenize("x")
    tokens, _, done = run(Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, FixedK(3)), prompt, max_tokens=30)
    text = "".join(t.text for t in tokens) + done.trailing_text
    stop = text[3:6]
    tokens, _, done = run(Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, FixedK(3)), prompt, max_tokens=30, stop=(stop,))
    assert done.reason == "stop"
    assert "".join(t.text for t in tokens) + done.trailing_text == text[: text.index(stop)]


def test_a_stop_inside_a_steps_kept_drafts_counts_only_the_drafts_before_it() -> None:
    """The figures describe the text returned: a stop string that ends the reply inside a step's kept
    drafts leaves the drafts past it uncounted, so kept drafts never outnumber the tokens given."""
    target, draft = stand_in_pair(CLOSE, eog_bias=NEVER_ENDS)
    prompt = target.tokenizer.tokenize("x")
    events = list(Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, FixedK(4)).generate(prompt, GenerationLimits(max_tokens=40)))
    given = [event for event in events if isinstance(event, TokenEvent)]
    text = "".join(event.text for event in given)
    # A stop made of a step's first two tokens, in a step that kept at least 3, where its text first appears.
    position, cut = 0, None
    for event in events:
        if isinstance(event, StepEvent) and event.accepted >= 3:
            stop = given[position].text + given[position + 1].text
            if text.index(stop) == len("".join(e.text for e in given[:position])):
                cut = stop, position + 1
                break
        position += isinstance(event, TokenEvent)
    assert cut is not None, "the stand-in pair should keep 3 drafts in a row somewhere"
    stop, last_given = cut
    tokens, steps, done = run(Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, FixedK(4)), prompt, max_tokens=40, stop=(stop,))
    assert done.reason == "stop" and len(tokens) == last_given + 1
    assert done.stats.accepted == sum(t.source is Source.DRAFT for t in tokens)
    assert steps[-1].used == 2 and steps[-1].accepted >= 3  # cut at the stop, though it kept more
    assert done.stats.drafted_whole == sum(step.drafted for step in steps) > done.stats.drafted_counted  # the cost, whole


def test_a_full_context_ends_generation_cleanly() -> None:
    target, draft = stand_in_pair(eog_bias=NEVER_ENDS, n_ctx=64)
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(4), seed=3)
    # A long prompt leaves room for a few tokens only, so the context fills before the model stops.
    prompt = target.tokenizer.tokenize("the cat sat on the mat " * 3)[: target.n_ctx - 6]
    tokens, _, done = run(generator, prompt, max_tokens=1000)
    assert done.reason == "context"
    assert len(prompt) + len(tokens) == target.n_ctx + 1  # the last token needs no cache slot


def test_a_stop_asked_for_between_steps_ends_after_a_whole_step_with_no_done_event() -> None:
    target, draft = stand_in_pair(eog_bias=NEVER_ENDS)
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(4), seed=2)
    prompt = target.tokenizer.tokenize("the cat sat")
    asked = []
    # Asked once before the prefill's one batch, then before each step: the fourth step is not made.
    events = list(generator.generate(prompt, GenerationLimits(max_tokens=100), lambda: asked.append(1) or len(asked) > 4))
    assert not any(isinstance(event, DoneEvent) for event in events)
    steps = [event for event in events if isinstance(event, StepEvent)]
    tokens = [event.token for event in events if isinstance(event, TokenEvent)]
    assert len(steps) == 3 and len(tokens) == sum(step.accepted + 1 for step in steps)  # each step given whole
    figures = generator.reply_stats  # what a caller that stopped reads: no more than what was given
    assert figures.generated == len(tokens) and figures.steps == 3
    assert generator.tokens == prompt + tokens
    assert_caches_follow(generator)
    follow_up = generator.tokens + target.tokenizer.tokenize(" on")
    assert generator.reused_prefix(follow_up) == len(generator.tokens) - 1


def test_a_prefill_stops_between_batches_when_asked_and_the_next_call_goes_on_from_there() -> None:
    """Stopped, nothing is yielded, the caches keep the batches decoded, and the same prompt again
    decodes only the rest and gives the same reply (test_engine.py runs the same check on llama.cpp)."""
    check_a_prefill_stopped_between_batches(*stand_in_pair(n_batch=16))


def check_a_prefill_stopped_between_batches(target, draft) -> None:
    """What a stopped prefill leaves, on any target and draft whose batch a prompt of 4 x 8 words
    exceeds three times."""
    prompt = target.tokenizer.tokenize("one two three four five six seven eight " * 4)
    assert len(prompt) > 3 * target.n_batch
    generator = Generator(target, Planner(NgramLookup(), ModelDrafter(draft)), GREEDY, FixedK(3))
    # Stopped before its first batch: no cache holds anything, and the first token is the pending one.
    assert list(generator.generate(prompt, GenerationLimits(max_tokens=8), lambda: True)) == []
    assert target.n_past == draft.n_past == 0 and generator.tokens == prompt[:1]
    asked = []
    assert list(generator.generate(prompt, GenerationLimits(max_tokens=8), lambda: asked.append(1) or len(asked) > 2)) == []
    # The draft model owes the last batch it was given (ModelDrafter.sync): taken in at its first draft.
    assert target.n_past == 2 * target.n_batch and draft.n_past == 2 * target.n_batch - draft.n_batch
    assert generator.tokens == prompt[: 2 * target.n_batch + 1]
    decoded_before = target.decoded_tokens
    tokens, _, done = run(generator, prompt, max_tokens=8)
    assert done.stats.prompt_tokens == len(prompt)
    prefilled = len(prompt) - 1 - 2 * target.n_batch
    assert target.decoded_tokens - decoded_before == prefilled + done.stats.steps + done.stats.drafted_counted
    generator.reset()
    again, _, _ = run(generator, prompt, max_tokens=8)
    assert [t.token for t in tokens] == [t.token for t in again]


# --- limits and refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [MemoryBoundAutoK, lambda: FixedK(24)], ids=["auto", "k24"])
def test_no_decode_asks_for_more_rows_than_one_batch_holds(policy) -> None:
    """Neither the cost profile nor a step asks for more logit rows than n_batch; a prompt longer than
    a batch is decoded a batch at a time."""
    target, draft = stand_in_pair(CLOSE, eog_bias=NEVER_ENDS, n_batch=8)
    generator = Generator(target, Planner(NgramLookup(), ModelDrafter(draft)), GREEDY, policy(), seed=1)
    prompt = target.tokenizer.tokenize("one two three four five six seven eight " * 2)
    tokens, steps, done = run(generator, prompt, max_tokens=60)
    assert done.reason == "max_tokens"
    assert max(step.drafted for step in steps) == target.n_batch - 1
    for model in (target, draft):
        assert max(rows for _, rows in model.decode_sizes) <= target.n_batch
    # The target decodes without logits only to prefill: a batch at a time.
    assert max(size for size, rows in target.decode_sizes if not rows) == target.n_batch


def test_prompt_longer_than_the_context_is_refused() -> None:
    target, draft = stand_in_pair()
    with pytest.raises(SpeccliError, match="context holds 256"):
        run(Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(4)), list(range(1, 60)) * 5, max_tokens=1)


@pytest.mark.parametrize(
    "settings, message",
    [
        (SamplingParams(temperature=-0.1), r"temperature must be from 0 \(greedy\) to 2"),
        (SamplingParams(temperature=2.5), r"temperature must be from 0 \(greedy\) to 2"),
        (SamplingParams(top_p=0), r"top-p must be in \(0, 1\]"),
        (SamplingParams(top_p=1.5), r"top-p must be in \(0, 1\]"),
        (SamplingParams(top_k=-1), "top-k must be >= 0"),
        (SamplingParams(min_p=1), r"min-p must be in \[0, 1\)"),
    ],
)
def test_bad_settings_are_refused_with_the_allowed_range(settings, message) -> None:
    target, draft = stand_in_pair()
    with pytest.raises(SpeccliError, match=message):
        Generator(target, Planner(model=ModelDrafter(draft)), settings, FixedK(4))


def test_empty_prompt_and_zero_max_tokens_are_refused() -> None:
    target, draft = stand_in_pair()
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SAMPLED, FixedK(4))
    with pytest.raises(SpeccliError, match="prompt is empty"):
        run(generator, [], max_tokens=3)
    with pytest.raises(SpeccliError, match="max tokens must be >= 1"):
        run(generator, [5], max_tokens=0)


# --- what the K policy is told --------------------------------------------------------------------------


class LookupsNeverDrafted(AutoK):
    """`auto` that drafts none of a lookup's matches, and records each proposal it judges instead."""

    def __init__(self) -> None:
        super().__init__()
        self.judged: list[tuple[list[int], list[int]]] = []

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        return Plan(0) if key.startswith("ngram") else super().plan(key, available, catch_up, owed_prompt)

    def observe(self, draft, step, yielded) -> None:
        if draft.judged is not None:
            self.judged.append((list(draft.judged.tokens), list(yielded)))
        super().observe(draft, step, yielded)


class LookupRecordingWhere(NgramLookup):
    """The n-gram lookup, noting the context's length at each match it finds."""

    def __init__(self) -> None:
        super().__init__()
        self.matched_at: list[int] = []

    def match(self, context, limit):
        found = super().match(context, limit)
        if found is not None:
            self.matched_at.append(len(context))
        return found


def test_a_lookup_not_drafted_is_judged_against_the_token_each_plain_step_yielded() -> None:
    target = stand_in(eog_bias=0.0)
    policy, lookup = LookupsNeverDrafted(), LookupRecordingWhere()
    generator = Generator(target, Planner(lookup), GREEDY, policy)
    prompt = target.tokenizer.tokenize("a b c d a b c d a b c d a b")
    tokens, steps, done = run(generator, prompt, max_tokens=16)
    assert done.stats.drafted_counted == 0 and policy.judged  # nothing verified, yet the lookup's matches were judged
    # Every step was plain: each proposal was judged against the one token the target yielded after the
    # context it was proposed for (an end-of-generation token, never shown, included).
    assert len(policy.judged) == len(lookup.matched_at)
    for (proposal, tokens_yielded), at in zip(policy.judged, lookup.matched_at):
        assert tokens_yielded == [generator.tokens[at]]
        assert proposal and NgramLookup().match(generator.tokens[:at], 64).following[: len(proposal)] == proposal
    assert sum(state.acceptance.judged_at[0] for key, state in policy.keys.items() if key.startswith("ngram")) > 0


def test_auto_is_told_the_draft_models_catch_up_costs_and_each_catch_up() -> None:
    """A draft model not asked for some steps falls behind: the generator's calibration hands `auto` the
    line through the model's timed catch-ups, and each catch-up in the run is learnt from."""

    class PlainStepsAtFirst(AutoK):  # 4 plain steps, then 2-token drafts, whatever the estimates say
        asked = 0

        def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
            self.asked += 1
            return Plan(0) if self.asked <= 4 else Plan(min(available, 2))

    target, draft = stand_in_pair(eog_bias=NEVER_ENDS)
    policy = PlainStepsAtFirst()
    generator = Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, policy)
    calibrated, learned = [], []
    calibrate = policy.calibrate

    def calibrate_and_watch(*costs) -> None:
        calibrate(*costs)
        cost = policy.keys["model"].cost
        calibrated.append(dict(vars(cost)))
        learn = cost.learn_catch_up
        cost.learn_catch_up = lambda tokens, seconds, level: (learned.append((tokens, seconds)), learn(tokens, seconds, level))

    policy.calibrate = calibrate_and_watch
    run(generator, target.tokenizer.tokenize("a b c d e f"), max_tokens=12)
    assert calibrated[0]["catch_up_per_token"] > 0 and calibrated[0]["catch_up_fixed"] >= 0
    # After 4 plain steps the model lacks the prompt's last token and their 4: it takes in all but the last
    # in one decode (the last goes with its first draft token).
    assert [tokens for tokens, _ in learned] == [4] and learned[0][1] > 0


# --- exactness ------------------------------------------------------------------------------------------

SAMPLES = 600  # the control needs about 410 (tests/benchmarks/RESULTS.md, *Chi-square power*)
# Temperature and top-k make processed and raw distributions differ, which a biased rule exposes.
SETTINGS = SamplingParams(temperature=0.7, top_k=12)


def two_token_p_value(policy, seed: int) -> tuple[float, object]:
    """The chi-square p-value of SAMPLES replies' first two tokens against the target's exact joint
    distribution (from its table), drafted by a ModelDrafter over the related draft; and their figures."""
    target, draft = stand_in_pair()
    prompt = target.tokenizer.tokenize("the cat")
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, policy, seed=seed)
    pairs, figures = sampled_pairs_and_stats(generator, prompt, SAMPLES)
    return chi_square_p_value(pairs, expected), figures


@pytest.mark.parametrize("policy", [lambda: FixedK(3), MemoryBoundAutoK], ids=["k3", "auto"])
def test_the_first_two_tokens_follow_the_targets_exact_distribution(policy) -> None:
    policy = policy()
    p_value, figures = two_token_p_value(policy, seed=5)
    assert 0 < figures.accepted < figures.drafted_counted, "drafts should be both kept and rejected"
    if isinstance(policy, AutoK):
        lengths = [length for length, steps in figures.draft_lengths.items() if length and steps >= 50]
        assert len(lengths) >= 2, f"auto should vary its draft length: {figures.draft_lengths}"
    assert p_value > 1e-3, f"p={p_value:.2e}"


def test_a_residual_that_keeps_the_rejected_token_is_detected(monkeypatch) -> None:
    """After a rejection, drawing from p itself (the rejected token included) instead of
    norm(max(0, p - q)) over-weights the tokens the draft likes."""
    monkeypatch.setattr(verify_module, "residual_distribution", lambda p, q: p)
    p_value, _ = two_token_p_value(FixedK(3), seed=5)
    assert p_value < 1e-6, f"the biased rule passed: p={p_value:.2e}"


def test_the_stand_ins_table_is_what_its_decodes_return() -> None:
    """The exact distribution above is read from the table: it must be what decoding gives, batched or not."""
    target = stand_in()
    context = target.tokenizer.tokenize("the cat sat")
    rows = target.decode(context, n_logit_rows=3).copy()
    assert np.array_equal(rows, np.stack([target.next_logits(context[:n]) for n in (9, 10, 11)]))
    target.truncate(2)
    assert np.array_equal(target.decode(context[2:])[0], rows[2]) and target.held == context


def test_a_cost_profile_leaves_every_cache_as_it_was():
    """Measured mid-conversation (bench's samples, a generator's own fallback), the profile decodes at the
    caches' end and drops what it decoded: the next step sees the same caches and the same logits."""
    target, draft = stand_in_pair(eog_bias=NEVER_ENDS)
    generator = Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, FixedK(2))
    run(generator, [1, 2, 3, 4, 5], max_tokens=6)
    held = (list(target.held), list(draft.held))
    before = target.decode([generator.tokens[-1]], n_logit_rows=1).copy()
    target.truncate(len(held[0]))
    costs = measure_costs(target, generator.drafter, generator.tokens, (2, 4, 25), GREEDY)
    assert (target.held, draft.held) == held
    assert set(costs.decode_seconds) == {1, 2, 4, 25} and costs.draft_costs["model"].token_seconds > 0
    assert np.array_equal(target.decode([generator.tokens[-1]], n_logit_rows=1), before)
