"""serve's slots (`--parallel`): several generations whose decodes meet in one llama_decode.

Exactness: a slot's first two tokens, sampled while two other slots generate beside it, follow the target
alone's law (χ², with the control of an engine that hands a slot another slot's rows, which must fail);
greedy replies generated together equal the same replies generated one at a time, through a real server.
Then what a client sees: the slot holding a prompt's prefix takes it, one client leaving does not
disturb the others, a long prompt is taken in by chunks beside them, /metrics counts the batches.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import numpy as np
import pytest

from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import Planner
from speccli.drafting.policy import FixedK
from speccli.llama.model import LoadOptions, Model
from speccli.server.launch import ServeSettings, build_service, serving_in_thread
from speccli.server.slots import PROMPT_CHUNK, GatedSequence, Rendezvous
from tests.tiny_gguf import TinyConfig, write_related_pair
from tests.test_server import MODEL, client, get, metric
from tests.token_distribution import chi_square_p_value
from tests.two_token_distribution import exact_two_token_distribution

SAMPLES = 2000  # as tests/test_engine_distribution.py's, whose controls' power it measured
SETTINGS = SamplingParams(temperature=0.7, top_k=12)
SLOTS = 3


@pytest.fixture(scope="module")
def slotted_pair(tmp_path_factory):
    """The distribution tests' related pair, each model's cache holding SLOTS sequences of 256 tokens."""
    paths = write_related_pair(tmp_path_factory.mktemp("slots"), target_layers=4, draft_layers=2, eps=0.3)
    options = LoadOptions(n_ctx=256 * SLOTS, n_threads=1, n_seq=SLOTS)
    with Model(paths[0], options) as target, Model(paths[1], options) as draft:
        yield target, draft


def first_two_tokens_beside_others(target: Model, draft: Model, prompt: list[int], n: int) -> list[tuple[int, ...]]:
    """n replies' first two tokens in slot 0 (K = 3 model drafts), sampled while slots 1 and 2 generate
    other prompts' replies beside it until it is done: every decode is a batch of the three."""
    rendezvous = Rendezvous([draft, target])

    def generator(slot: int, seed: int) -> Generator:
        target_seq = GatedSequence(target.sequence(slot), rendezvous)
        drafter = Planner(model=ModelDrafter(GatedSequence(draft.sequence(slot), rendezvous)))
        return Generator(target_seq, drafter, SETTINGS, FixedK(3), seed=seed)

    done, firsts = threading.Event(), []

    def beside(slot: int) -> None:
        others = generator(slot, seed=slot)
        while not done.is_set():
            rendezvous.enter()  # a slot touches the caches only between enter and leave
            try:
                for _ in others.generate([1, 40 + 9 * slot, 7 * slot, 3], GenerationLimits(max_tokens=12)):
                    pass
                others.reset()
            finally:
                rendezvous.leave()

    def measured() -> None:
        ours = generator(0, seed=2024)
        try:
            for _ in range(n):
                rendezvous.enter()
                try:
                    list(ours.generate(prompt, GenerationLimits(max_tokens=2)))
                    firsts.append(tuple(ours.tokens[len(prompt):len(prompt) + 2]))
                    ours.reset()
                finally:
                    rendezvous.leave()
        finally:
            done.set()

    threads = [threading.Thread(target=beside, args=(slot,)) for slot in (1, 2)] + [threading.Thread(target=measured)]
    [thread.start() for thread in threads]
    [thread.join(timeout=600) for thread in threads]
    assert not any(thread.is_alive() for thread in threads)
    return firsts


def handing_out_the_next_parts_rows(real):
    """The broken engine: each part of a batched decode gets the rows of the part after it (where they
    are as many), as an offset slip in reading llama.cpp's output buffer would give."""
    def decode_together(self, parts):
        rows = real(self, parts)
        return [rows[(i + 1) % len(rows)] if rows[(i + 1) % len(rows)].shape == row.shape else row
                for i, row in enumerate(rows)]
    return decode_together


@pytest.mark.parametrize("broken", [False, True], ids=["slots", "control-other-slots-rows"])
def test_a_slots_first_tokens_follow_the_targets_law_while_other_slots_generate(slotted_pair, broken, monkeypatch):
    target, draft = slotted_pair
    prompt = target.tokenizer.tokenize(b"the cat sat on")
    target.reset()
    expected = exact_two_token_distribution(target, prompt, SETTINGS)
    target.reset()
    draft.reset()
    if broken:
        monkeypatch.setattr(Model, "decode_together", handing_out_the_next_parts_rows(Model.decode_together))
    p_value = chi_square_p_value(first_two_tokens_beside_others(target, draft, prompt, SAMPLES), expected)
    target.reset()
    draft.reset()
    if broken:
        assert p_value < 1e-6, f"the broken engine passed: p={p_value:.2e}"
    else:
        assert p_value > 1e-3, f"p={p_value:.2e}"


def test_the_rendezvous_batches_every_slots_decode_and_chunks_a_long_prompt(slotted_pair):
    """Three greedy generations in three threads: each equals its own run alone, and the target's
    decodes are shared (fewer calls than the three runs made alone); a prompt longer than PROMPT_CHUNK
    arriving beside them goes in by chunks, so no decode beside it takes more than PROMPT_CHUNK of it;
    every decode of either model runs in the one decode thread (llama.cpp's OpenMP teams: slots.py)."""
    target, draft = slotted_pair
    greedy = SamplingParams(temperature=0)
    prompts = [[1, 5 + i, 7, 9, 11 + i] for i in range(2)] + [[1] + [20 + i % 50 for i in range(3 * PROMPT_CHUNK)]]

    def run(slot: int, rendezvous: Rendezvous | None, results: list) -> None:
        def gated(model):
            return GatedSequence(model.sequence(slot), rendezvous) if rendezvous else model.sequence(slot)
        generator = Generator(gated(target), Planner(model=ModelDrafter(gated(draft))), greedy, FixedK(4), seed=0)
        if rendezvous:
            rendezvous.enter()
        try:
            results[slot] = list(generator.generate(prompts[slot], GenerationLimits(max_tokens=30)))[-1], list(generator.tokens)
        finally:
            if rendezvous:
                rendezvous.leave()

    target.reset(), draft.reset()
    alone = [None] * SLOTS
    before = target.decodes
    for slot in range(SLOTS):
        run(slot, None, alone)
    decodes_alone = target.decodes - before
    target.reset(), draft.reset()

    widths, callers = [], set()

    def recording(model):
        real = model.decode_together

        def decode_together(parts):
            callers.add(threading.get_ident())
            if len(parts) > 1 and model is target:
                widths.append(max(len(tokens) for sequence, tokens, rows in parts if rows == 0) if any(
                    rows == 0 for _, _, rows in parts) else 0)
            return real(parts)
        return decode_together

    target.decode_together, draft.decode_together = recording(target), recording(draft)
    rendezvous = Rendezvous([draft, target], decode_thread=True)
    try:
        together = [None] * SLOTS
        threads = [threading.Thread(target=run, args=(slot, rendezvous, together)) for slot in range(SLOTS)]
        before = target.decodes
        [thread.start() for thread in threads]
        [thread.join(timeout=120) for thread in threads]
    finally:
        del target.decode_together, draft.decode_together
        rendezvous.close()
    target.reset(), draft.reset()
    assert [tokens for _, tokens in together] == [tokens for _, tokens in alone]
    assert target.decodes - before < decodes_alone
    assert widths and max(widths) <= PROMPT_CHUNK
    assert callers == {rendezvous._decoder.ident}


def test_greedy_replies_served_together_equal_each_served_alone(tmp_path):
    """A real server with three slots: three greedy requests at once (streamed and whole), then each
    again alone; the replies are the same text. /metrics shows the slots and decodes wider than a slot's."""
    paths = write_related_pair(tmp_path, target_layers=8, draft_layers=2, eps=0.05)
    questions = ["tell me about the sea", "a list of fruit", "why is the sky blue"]
    with ExitStack() as stack:
        options = LoadOptions(n_ctx=256 * SLOTS, n_threads=1, n_seq=SLOTS)
        target = stack.enter_context(Model(paths[0], options))
        draft = stack.enter_context(Model(paths[1], options))
        service = build_service(MODEL, target, draft, ServeSettings(port=0, spec="ngram+model", k=4, parallel=SLOTS))
        url = stack.enter_context(serving_in_thread(service))
        c = client(url)

        def ask(question: str, stream: bool) -> str:
            reply = c.completions.create(model=MODEL, prompt=question, max_tokens=40, temperature=0, stream=stream)
            return "".join(chunk.choices[0].text for chunk in reply if chunk.choices) if stream else reply.choices[0].text

        with ThreadPoolExecutor(SLOTS) as pool:
            together = list(pool.map(lambda i: ask(questions[i], stream=i % 2 == 0), range(SLOTS)))
        text = get(url, "/metrics")[1]
        alone = [ask(question, stream=False) for question in questions]
    assert together == alone
    assert metric(text, "slots") == SLOTS and metric(text, "slots_busy") == 0
    rows, decodes = metric(text, 'llama_decode_rows_total{model="target"}'), metric(text, 'llama_decodes_total{model="target"}')
    assert rows / decodes > 1
    assert metric(text, "time_to_first_token_seconds_count") == SLOTS


def test_a_prompt_goes_to_the_slot_holding_its_start_and_a_client_leaving_disturbs_no_other(tmp_path):
    """Two slots: two conversations, each followed up, find their earlier turns in their own slot's cache
    (idle slots that hold nothing are taken least recently used first). A stream whose client leaves
    mid-reply frees its slot; the reply beside it goes on to the end, equal to its reply alone."""
    paths = write_related_pair(tmp_path, target_layers=4, draft_layers=2, eps=0.05,
                               config=TinyConfig(context_length=2048))
    with ExitStack() as stack:
        # 2,048 tokens a slot: room the stream its client leaves cannot fill before the client is gone
        # (at about 1,100 tokens a second here, a 200-token reply could end first and count as completed)
        options = LoadOptions(n_ctx=4096, n_threads=1, n_seq=2)
        target = stack.enter_context(Model(paths[0], options))
        draft = stack.enter_context(Model(paths[1], options))
        service = build_service(MODEL, target, draft, ServeSettings(port=0, spec="model", k=3, parallel=2))
        url = stack.enter_context(serving_in_thread(service))
        c = client(url)
        first, second = "one two three four five six seven", "alpha beta gamma delta epsilon"
        for prompt in (first, second):
            c.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
        cached = [c.completions.create(model=MODEL, prompt=prompt + " and more", max_tokens=4, temperature=0)
                  .usage.prompt_tokens_details.cached_tokens for prompt in (first, second)]
        assert min(cached) >= 5

        alone = c.completions.create(model=MODEL, prompt=second, max_tokens=60, temperature=0).choices[0].text
        left = c.completions.create(model=MODEL, prompt=first, max_tokens=2000, temperature=0.9, stream=True)
        next(iter(left))
        with ThreadPoolExecutor(1) as pool:
            beside = pool.submit(lambda: c.completions.create(model=MODEL, prompt=second, max_tokens=60, temperature=0))
            for _ in zip(range(3), left):
                pass
            left.close()  # the client leaves mid-reply
            assert beside.result(timeout=120).choices[0].text == alone
        text = get(url, "/metrics")[1]
    assert metric(text, 'requests_total{outcome="cancelled"}') == 1
    assert metric(text, 'requests_total{outcome="error"}') == 0
    assert np.isclose(metric(text, "slots_busy"), 0)
