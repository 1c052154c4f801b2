"""The generation loop on real tiny GGUF models, where llama.cpp's own behaviour matters: a context filled
to its last slot, context and batch clamps, a target's padding ids, a prefill stopped between batches;
and the text assembler. The loop's bookkeeping (caches rolled back, limits, stop strings, ends of
generation, chains, take-overs, shadows, refusals) is tested on a numpy stand-in: test_generator.py."""
from __future__ import annotations

import pytest

from speccli.llama.model import ContextFullError, LoadOptions, Model
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.stats import DoneEvent, StepEvent, TokenEvent
from speccli.core.text import TextAssembler
from speccli.core.sampling import SamplingParams
from speccli.drafting.planner import Planner
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramLookup
from speccli.drafting.policy import FixedK
from tests.conftest import MemoryBoundAutoK, loaded_related_pair
from tests.test_generator import check_a_prefill_stopped_between_batches
from tests.tiny_gguf import write_related_pair

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    with loaded_related_pair(tmp_path_factory.mktemp("engine"), target_layers=4, draft_layers=2, eps=0.1) as pair:
        yield pair


@pytest.fixture
def generator(models):
    target, draft = models
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SamplingParams(temperature=0.9), FixedK(4), seed=3)
    generator.reset()
    return generator


def run(generator: Generator, prompt, **limits):
    events = list(generator.generate(prompt, GenerationLimits(**limits)))
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return [e for e in events if isinstance(e, TokenEvent)], [e for e in events if isinstance(e, StepEvent)], done


def test_a_full_context_ends_generation_cleanly(generator) -> None:
    # A long prompt leaves room for a few tokens only, so the context fills before the model stops: the
    # last step fills llama.cpp's context (as it rounded it) to its last slot.
    prompt = generator.target.tokenizer.tokenize("the cat sat on the mat " * 40)[: generator.target.n_ctx - 6]
    tokens, _, done = run(generator, prompt, max_tokens=1000)
    assert done.reason == "context"
    assert len(prompt) + len(tokens) == generator.target.n_ctx + 1  # the last token needs no cache slot


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
        generator = Generator(target, Planner(model=ModelDrafter(draft)), SamplingParams(temperature=1.0), FixedK(3), seed=5)
        tokens, _, done = run(generator, target.tokenizer.tokenize("a"), max_tokens=300)
    padding_emitted = [t.token for t in tokens if t.token >= 512]
    assert padding_emitted, "the test must exercise ids the draft lacks"
    assert done.reason in ("max_tokens", "eog")


def test_a_prefill_stops_between_batches_when_asked_and_the_next_call_goes_on_from_there(tmp_path) -> None:
    """A long prompt's prefill is seconds of decodes: Ctrl-C in chat, or a client leaving the server or
    the server shutting down, had to wait for all of it. Stopped, nothing is yielded, the caches keep
    the batches decoded, and the same prompt again decodes only the rest and gives the same reply."""
    target_path, draft_path = write_related_pair(tmp_path, target_layers=4, draft_layers=2, eps=0.1)
    options = LoadOptions(n_ctx=16, n_threads=1)  # 16 tokens a decode
    with Model(target_path, options) as target, Model(draft_path, options) as draft:
        check_a_prefill_stopped_between_batches(target, draft)


@pytest.mark.parametrize("policy", [MemoryBoundAutoK, lambda: FixedK(24)], ids=["auto", "k24"])
def test_a_small_context_clamps_drafts_to_what_one_decode_verifies(tmp_path, policy) -> None:
    """llama.cpp clamps its batch to a small requested context (--ctx 16: 16 rows a decode, though it
    rounds the context itself up to 256). Neither the cost profile nor a step may ask for more rows.
    (`auto` at pretended costs: at this CPU's, under load, it once drafted nothing at all.)"""
    target_path, draft_path = write_related_pair(tmp_path, target_layers=4, draft_layers=2, eps=0.1)
    options = LoadOptions(n_ctx=16, n_threads=1)
    with Model(target_path, options) as target, Model(draft_path, options) as draft:
        assert target.n_batch == 16 < target.n_ctx
        drafter = Planner(NgramLookup(), ModelDrafter(draft))
        generator = Generator(target, drafter, GREEDY, policy(), seed=1)
        prompt = target.tokenizer.tokenize("one two three four five six seven eight " * 4)
        tokens, steps, done = run(generator, prompt, max_tokens=60)
    assert done.reason in ("max_tokens", "eog") and tokens
    assert max(step.drafted for step in steps) <= 15
    assert any(step.drafted for step in steps)
