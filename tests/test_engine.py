"""The generation loop on real tiny GGUF models: limits, stop strings, context, cache reuse, bad input."""
from __future__ import annotations

import tracemalloc

import pytest

from speccli.llama.model import ContextFullError, LoadOptions, Model
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.stats import DoneEvent, Source, StepEvent, TokenEvent
from speccli.core.text import TextAssembler
from speccli.errors import SpeccliError
from speccli.core.sampling import SamplingParams
from speccli.core.seam import Plan
from speccli.drafting.chain import ChainDrafter
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramDrafter
from speccli.drafting.policy import AutoK, FixedK
from tests.conftest import loaded_related_pair
from tests.tiny_gguf import write_related_pair
from tests.test_drafting import request

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    with loaded_related_pair(tmp_path_factory.mktemp("engine"), target_layers=4, draft_layers=2, eps=0.1) as pair:
        yield pair


@pytest.fixture
def generator(models):
    target, draft = models
    generator = Generator(target, ModelDrafter(draft), SamplingParams(temperature=0.9), FixedK(4), seed=3)
    generator.reset()
    return generator


def run(generator: Generator, prompt, **limits):
    events = list(generator.generate(prompt, GenerationLimits(**limits)))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return [e for e in events if isinstance(e, TokenEvent)], [e for e in events if isinstance(e, StepEvent)], done


def test_max_tokens_is_exact_and_extra_accepted_tokens_are_forgotten(generator) -> None:
    prompt = generator.target.tokenizer.tokenize("a b c")
    tokens, steps, done = run(generator, prompt, max_tokens=5)
    assert len(tokens) == done.stats.generated
    if done.reason == "max_tokens":
        assert len(tokens) == 5
    else:  # it ended itself first: the end-of-generation token is kept last, and was not shown
        assert done.reason == "eog" and len(tokens) < 5
        assert generator.target.tokenizer.is_end_of_generation(generator.tokens[-1])
    # The sequence holds the prompt and exactly the tokens shown; neither cache holds more.
    shown = generator.tokens[: len(generator.tokens) - (done.reason == "eog")]
    assert shown == prompt + [t.token for t in tokens]
    assert generator.target.n_past <= len(generator.tokens) - 1
    assert generator.drafter.model.n_past <= len(generator.tokens) - 1
    assert sum(step.drafted for step in steps) == done.stats.drafted_counted


def test_stop_string_ends_the_text_before_it(models) -> None:
    target, draft = models
    prompt = target.tokenizer.tokenize("x")
    free = Generator(target, ModelDrafter(draft), GREEDY, FixedK(3))
    free.reset()
    tokens, _, done = run(free, prompt, max_tokens=30)
    text = "".join(t.text for t in tokens) + done.trailing_text
    assert len(text) > 6, "the tiny model should say something printable"
    stop = text[3:6]
    stopped = Generator(target, ModelDrafter(draft), GREEDY, FixedK(3))
    stopped.reset()
    tokens, _, done = run(stopped, prompt, max_tokens=30, stop=(stop,))
    assert done.reason == "stop"
    assert "".join(t.text for t in tokens) + done.trailing_text == text[: text.index(stop)]


def test_a_stop_inside_a_steps_kept_drafts_counts_only_the_drafts_before_it(models) -> None:
    """The figures describe the text returned: a stop string that ends the reply inside a step's kept
    drafts leaves the drafts past it uncounted, so kept drafts never outnumber the tokens given."""
    target, draft = models
    prompt = target.tokenizer.tokenize("x")
    free = Generator(target, ModelDrafter(draft), GREEDY, FixedK(4))
    free.reset()
    events = list(free.generate(prompt, GenerationLimits(max_tokens=40)))
    given = [event for event in events if isinstance(event, TokenEvent)]
    text, starts, cut = "", [], None
    for event in given:
        starts.append(len(text))
        text += event.text
    # A stop within the second kept draft of a step that kept at least 3, where its text first appears.
    position = 0
    for event in events:
        if isinstance(event, StepEvent) and event.accepted >= 3 and position + 1 < len(given):
            stop, start = given[position + 1].text[:2], starts[position + 1]
            if len(stop) == 2 and text.index(stop) == start:
                cut = (stop, position + 1)
                break
        position += isinstance(event, TokenEvent)
    assert cut is not None, "the tiny pair should keep 3 drafts in a row somewhere"
    stop, given_before = cut
    stopped = Generator(target, ModelDrafter(draft), GREEDY, FixedK(4))
    stopped.reset()
    tokens, steps, done = run(stopped, prompt, max_tokens=40, stop=(stop,))
    assert done.reason == "stop" and len(tokens) == given_before + 1
    kept_drafts_given = sum(t.source is Source.DRAFT for t in tokens)
    assert done.stats.accepted == kept_drafts_given
    assert steps[-1].used == 2 and steps[-1].accepted >= 3  # cut at the stop, though it kept more
    assert done.stats.drafted_whole == sum(step.drafted for step in steps) > done.stats.drafted_counted  # the cost, whole


def test_a_full_context_ends_generation_cleanly(generator) -> None:
    # A long prompt leaves room for a few tokens only, so the context fills before the model stops.
    prompt = generator.target.tokenizer.tokenize("the cat sat on the mat " * 40)[: generator.target.n_ctx - 6]
    tokens, _, done = run(generator, prompt, max_tokens=1000)
    assert done.reason == "context"
    assert len(prompt) + len(tokens) == generator.target.n_ctx + 1  # the last token needs no cache slot


def test_a_second_call_decodes_only_the_new_tokens(generator) -> None:
    target = generator.target
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


def test_reset_frees_the_rows_a_draft_model_drafted_into(models) -> None:
    """serve keeps a generator for each drafting configuration clients ask for (K up to 64), and resets
    the one it leaves: its K rows of probabilities must go with the reset (64 MiB at Gemma's vocabulary)."""
    target, draft = models
    k = 32
    row_bytes = k * draft.n_vocab * 4
    tracemalloc.start()
    try:
        generator = Generator(target, ModelDrafter(draft), SamplingParams(temperature=0.9), FixedK(k), seed=1)
        run(generator, target.tokenizer.tokenize("the cat sat"), max_tokens=k + 2)  # room for a K-token draft
        held = tracemalloc.get_traced_memory()[0]
        generator.reset()
        assert held - tracemalloc.get_traced_memory()[0] >= row_bytes
    finally:
        tracemalloc.stop()


def test_prompt_longer_than_the_context_is_refused(generator) -> None:
    with pytest.raises(SpeccliError, match="context holds 256"):
        run(generator, list(range(3, 300)), max_tokens=1)


@pytest.mark.parametrize(
    "settings, k, message",
    [
        (SamplingParams(temperature=-0.1), 4, "temperature must be >= 0"),
        (SamplingParams(top_p=0), 4, r"top-p must be in \(0, 1\]"),
        (SamplingParams(top_p=1.5), 4, r"top-p must be in \(0, 1\]"),
        (SamplingParams(top_k=-1), 4, "top-k must be >= 0"),
        (SamplingParams(min_p=1), 4, r"min-p must be in \[0, 1\)"),
    ],
)
def test_bad_settings_are_refused_with_the_allowed_range(models, settings, k, message) -> None:
    target, draft = models
    with pytest.raises(SpeccliError, match=message):
        Generator(target, ModelDrafter(draft), settings, FixedK(k))


def test_empty_prompt_and_zero_max_tokens_are_refused(generator) -> None:
    with pytest.raises(SpeccliError, match="prompt is empty"):
        run(generator, [], max_tokens=3)
    with pytest.raises(SpeccliError, match="max tokens must be >= 1"):
        run(generator, [5], max_tokens=0)


def test_decoding_past_the_context_raises_a_clear_error(models) -> None:
    target, _ = models
    target.reset()
    with pytest.raises(ContextFullError, match="context window is full"):
        target.decode(list(range(3, 3 + target.n_ctx + 1)), n_logit_rows=1)
    assert target.n_past == 0


def test_text_never_splits_a_utf8_character_and_holds_back_stop_prefixes() -> None:
    assembler = TextAssembler(stop=["STOP"])
    euro = "€".encode()
    assert assembler.push(euro[:1]) == ""
    assert assembler.push(euro[1:]) == "€"
    assert assembler.push(b"ab ST") == "ab "  # "ST" may begin STOP: held back
    assert assembler.push(b"AR") == "STAR"
    assert assembler.push(b"xSTO") == "x"
    assert assembler.push(b"P and more") == ""
    assert assembler.stopped
    assert assembler.flush() == ""


def test_a_character_cut_at_the_end_is_left_out_but_bytes_that_are_not_utf8_are_replaced() -> None:
    assembler = TextAssembler(stop=[])
    assert assembler.push(b"caf\xc3") == "caf"
    assert assembler.flush() == ""  # a reply cut after the first byte of "é": not "caf\ufffd"
    assert assembler.push(b"\xff ok \xe2\x82") == "\ufffd ok "  # no character begins with 0xff
    assert assembler.flush() == ""


def test_a_target_with_extra_vocabulary_runs_with_a_smaller_draft(tmp_path) -> None:
    """check-vocab tolerates a target padded past the draft's vocabulary. Padding ids the target
    emits are shown to the draft as token 0 (its proposals change, the output distribution does not)."""
    from tests.tiny_gguf import TinyConfig, spm_vocabulary, write_tiny_gguf

    base = spm_vocabulary(512)
    flat = dict(head_scale=0.5)  # near-uniform, so the target does emit its padding ids
    draft_path = write_tiny_gguf(tmp_path / "draft.gguf", TinyConfig(vocab=base, **flat))
    target_path = write_tiny_gguf(tmp_path / "target.gguf", TinyConfig(vocab=base.padded(64), n_layer=3, **flat))
    options = LoadOptions(n_ctx=512, n_threads=1)
    with Model(target_path, options) as target, Model(draft_path, options) as draft:
        assert target.n_vocab == draft.n_vocab + 64
        generator = Generator(target, ModelDrafter(draft), SamplingParams(temperature=1.0), FixedK(3), seed=5)
        tokens, _, done = run(generator, target.tokenizer.tokenize("a"), max_tokens=300)
    padding_emitted = [t.token for t in tokens if t.token >= 512]
    assert padding_emitted, "the test must exercise ids the draft lacks"
    assert done.reason in ("max_tokens", "eog")


class LookupsNeverDrafted(AutoK):
    """`auto` that drafts none of a lookup's matches, and records each proposal it judges instead."""

    def __init__(self) -> None:
        super().__init__()
        self.judged: list[tuple[list[int], list[int]]] = []

    def plan(self, key: str, available: int, catch_up: int = 0) -> Plan:
        return Plan(0) if key.startswith("ngram") else super().plan(key, available, catch_up)

    def observe(self, draft, step, yielded) -> None:
        if draft.shadow is not None:
            self.judged.append((list(draft.shadow.tokens), list(yielded)))
        super().observe(draft, step, yielded)


class LookupRecordingWhere(NgramDrafter):
    """The n-gram lookup, noting the context's length at each proposal it hands on as a shadow."""

    def __init__(self) -> None:
        super().__init__()
        self.shadowed_at: list[int] = []

    def propose(self, request):
        draft = super().propose(request)
        if draft.shadow is not None:
            self.shadowed_at.append(len(request.context))
        return draft


def test_a_lookup_not_drafted_is_judged_against_the_token_each_plain_step_yielded(models) -> None:
    target, _ = models
    policy, lookup = LookupsNeverDrafted(), LookupRecordingWhere()
    generator = Generator(target, lookup, GREEDY, policy)
    generator.reset()
    prompt = target.tokenizer.tokenize("a b c d a b c d a b c d a b")
    tokens, steps, done = run(generator, prompt, max_tokens=16)
    assert done.stats.drafted_counted == 0 and policy.judged  # nothing verified, yet the lookup's matches were judged
    # Every step was plain: each proposal was judged against the one token the target yielded after the
    # context it was proposed for (an end-of-generation token, never shown, included).
    assert len(policy.judged) == len(lookup.shadowed_at)
    for (proposal, tokens_yielded), at in zip(policy.judged, lookup.shadowed_at):
        assert tokens_yielded == [generator.tokens[at]]
        not_drafted = request(generator.tokens[:at], limit=64, length_for=lambda key, available, catch_up: 0)
        assert proposal and NgramDrafter().propose(not_drafted).shadow.tokens[: len(proposal)] == proposal
    assert sum(state.acceptance.judged_at[0] for key, state in policy.keys.items() if key.startswith("ngram")) > 0


def test_auto_is_told_the_draft_models_catch_up_costs_and_each_catch_up(models) -> None:
    """A draft model not asked for some steps falls behind: the generator's calibration hands `auto` the
    line through the model's timed catch-ups, and each catch-up in the run is learnt from."""

    class PlainStepsAtFirst(AutoK):  # 4 plain steps, then 2-token drafts, whatever the estimates say
        asked = 0

        def plan(self, key: str, available: int, catch_up: int = 0) -> Plan:
            self.asked += 1
            return Plan(0) if self.asked <= 4 else Plan(min(available, 2))

    target, draft = models
    policy = PlainStepsAtFirst()
    generator = Generator(target, ModelDrafter(draft), GREEDY, policy)
    generator.reset()
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


def test_a_prefill_stops_between_batches_when_asked_and_the_next_call_goes_on_from_there(tmp_path) -> None:
    """A long prompt's prefill is seconds of decodes: Ctrl-C in chat, or a client leaving the server or
    the server shutting down, had to wait for all of it. Stopped, nothing is yielded, the caches keep
    the batches decoded, and the same prompt again decodes only the rest and gives the same reply."""
    target_path, draft_path = write_related_pair(tmp_path, target_layers=4, draft_layers=2, eps=0.1)
    options = LoadOptions(n_ctx=16, n_threads=1)  # 16 tokens a decode
    with Model(target_path, options) as target, Model(draft_path, options) as draft:
        prompt = target.tokenizer.tokenize("one two three four five six seven eight " * 4)
        assert len(prompt) > 3 * target.n_batch
        generator = Generator(target, ChainDrafter([NgramDrafter(), ModelDrafter(draft)]), GREEDY, FixedK(3))
        # Stopped before its first batch: no cache holds anything, and the first token is the pending one.
        assert list(generator.generate(prompt, GenerationLimits(max_tokens=8), lambda: True)) == []
        assert target.n_past == draft.n_past == 0 and generator.tokens == prompt[:1]
        asked = []
        stopped = list(generator.generate(prompt, GenerationLimits(max_tokens=8), lambda: asked.append(1) or len(asked) > 2))
        assert stopped == []
        assert target.n_past == draft.n_past == 2 * target.n_batch and generator.tokens == prompt[: 2 * target.n_batch + 1]
        decoded_before = target.decoded_tokens
        tokens, _, done = run(generator, prompt, max_tokens=8)
        assert done.stats.prompt_tokens == len(prompt)
        prefilled = len(prompt) - 1 - 2 * target.n_batch
        assert target.decoded_tokens - decoded_before == prefilled + done.stats.steps + done.stats.drafted_counted
        generator.reset()
        again, _, _ = run(generator, prompt, max_tokens=8)
    assert [t.token for t in tokens] == [t.token for t in again]


@pytest.mark.parametrize("policy", [AutoK, lambda: FixedK(24)], ids=["auto", "k24"])
def test_a_small_context_clamps_drafts_to_what_one_decode_verifies(tmp_path, policy) -> None:
    """llama.cpp clamps its batch to a small requested context (--ctx 16: 16 rows a decode, though it
    rounds the context itself up to 256). Neither the cost profile nor a step may ask for more rows."""
    target_path, draft_path = write_related_pair(tmp_path, target_layers=4, draft_layers=2, eps=0.1)
    options = LoadOptions(n_ctx=16, n_threads=1)
    with Model(target_path, options) as target, Model(draft_path, options) as draft:
        assert target.n_batch == 16 < target.n_ctx
        drafter = ChainDrafter([NgramDrafter(), ModelDrafter(draft)])
        generator = Generator(target, drafter, GREEDY, policy(), seed=1)
        prompt = target.tokenizer.tokenize("one two three four five six seven eight " * 4)
        tokens, steps, done = run(generator, prompt, max_tokens=60)
    assert done.reason in ("max_tokens", "eog") and tokens
    assert max(step.drafted for step in steps) <= 15
    assert any(step.drafted for step in steps)
