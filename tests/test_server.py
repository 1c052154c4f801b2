"""`speccli serve` on tiny real GGUF pairs, driven by the official `openai` client over loopback HTTP:
replies whole and streamed, the `speculative` object, per-request control, KV reuse, /metrics, every
malformed request, a client leaving mid-stream, a bounded load test, the queue limit, the command.

Tiny random models emit byte soup, so tests compare replies with each other and with `speccli chat`,
never with wording.
"""
from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import jsonschema
import openai
import pytest
from gguf import TokenType
from typer.testing import CliRunner

from speccli.bench.prompts import load_prompt_set
from speccli.chat.conversation import Conversation
from speccli.chat.template import chat_format_for
from speccli.cli.app import app as cli_app
from speccli.core.generator import PROFILE_TIMINGS, GenerationLimits
from speccli.core.sampling import SamplingParams
from speccli.core.stats import RunStats, StepEvent
from speccli.drafting.registry import DEFAULT_SPEC
from speccli.llama.model import LoadOptions, Model
from speccli.server.api_errors import APIError
from speccli.server.reply import speculative_summary
from speccli.server.launch import ServeSettings, bind, build_service, exposure_warning, serving_in_thread
from speccli.server.metrics import Metrics
from speccli.server.schemas import SpeculationControl
from speccli.server import worker as worker_module
from speccli.server.worker import Speculation
from tests.conftest import widest_verify_timings
from tests.test_engine_distribution import LookupFavouredK
from tests.tiny_gguf import TinyConfig, poisoned_copy, spm_vocabulary, write_related_pair

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny"
# Renders "<s><user>hi</s><assistant>": BOS and EOS by text, as real templates do.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
GREEDY = {"temperature": 0, "max_tokens": 16}
# A reply long enough to still be generating when a test acts on it (the endless model makes about
# 10k tokens/s here, and generation does not wait for the client to read).
LONG_CTX, LONG_REPLY = 65536, 60000


@pytest.fixture(scope="module")
def chat_pair(tiny_dir: Path) -> tuple[Path, Path]:
    vocab = replace(spm_vocabulary(512), chat_template=CHAT_TEMPLATE)
    return write_related_pair(tiny_dir / "server_chat", target_layers=4, draft_layers=2,
                              config=TinyConfig(vocab=vocab), name="server_chat")


@pytest.fixture(scope="module")
def endless_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """All logits equal, so greedy always picks token 0, made the piece "la ": replies that never end
    by themselves, to have something to interrupt and to keep the one generation slot busy."""
    vocab = spm_vocabulary(512)
    vocab = replace(
        vocab, tokens=("la\u2581",) + vocab.tokens[1:], token_types=(int(TokenType.NORMAL),) + vocab.token_types[1:],
        unk_id=None, chat_template=CHAT_TEMPLATE,
    )
    return write_related_pair(tiny_dir / "server_endless", target_layers=2, draft_layers=1,
                              config=TinyConfig(head_scale=0.0, vocab=vocab, context_length=LONG_CTX), name="server_endless")


@contextmanager
def serving(pair: tuple[Path, Path], *, n_ctx: int = 256, **settings) -> Iterator[str]:
    """A real server on a free loopback port, in a thread, over the pair loaded as `speccli serve` would;
    yields its base URL."""
    settings = {"spec": "model", "k": 3, **settings}
    with ExitStack() as stack:
        options = LoadOptions(n_ctx=n_ctx, n_threads=1)
        target = stack.enter_context(Model(pair[0], options))
        draft = stack.enter_context(Model(pair[1], options))
        service = build_service(MODEL, target, draft, ServeSettings(port=0, **settings))
        yield stack.enter_context(serving_in_thread(service))


def client(url: str, **options) -> openai.OpenAI:
    # No retries: a 503 must show, not be retried away.
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60, **options)


def ask(c: openai.OpenAI, text: str, **options):
    return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **{**GREEDY, **options})


def post(url: str, path: str, body: bytes | str | dict) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of a raw POST: for bodies the openai client will not send."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body if isinstance(body, bytes) else body.encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def get(url: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric(text: str, name: str) -> float:
    match = re.search(rf"^speccli_{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))

def await_metrics(url: str, ready, failure: str, timeout: float = 10.0) -> str:
    """/metrics polled until `ready(text)`, which must come within `timeout` seconds: its text then."""
    deadline = time.monotonic() + timeout
    while not ready(text := get(url, "/metrics")[1]):
        assert time.monotonic() < deadline, failure
        time.sleep(0.02)
    return text



# --- replies ----------------------------------------------------------------------------------------


def test_models_and_health(chat_pair):
    with serving(chat_pair) as url:
        assert [m.id for m in client(url).models.list()] == [MODEL]
        status, body = get(url, "/health")
        assert status == 200 and json.loads(body)["status"] == "ok"


def test_chat_completion_carries_usage_and_speculative_statistics(chat_pair):
    with serving(chat_pair, k=3) as url:
        reply = ask(client(url), "hello there")
    choice = reply.choices[0]
    assert choice.finish_reason in {"stop", "length"} and choice.message.role == "assistant"
    assert 0 < reply.usage.completion_tokens <= 16
    speculative = reply.model_extra["speculative"]
    assert speculative["enabled"] and speculative["spec"] == "model" and speculative["k"] == 3
    assert speculative["drafted"] > 0 and 0 <= speculative["accepted"] <= speculative["drafted"]
    assert speculative["acceptance_rate"] == pytest.approx(speculative["accepted"] / speculative["drafted"], abs=1e-4)
    assert set(speculative["draft_lengths"]) <= {"0", "1", "2", "3"}
    assert sum(speculative["draft_lengths"].values()) == speculative["target_decodes"]
    assert len(speculative["acceptance_by_position"]) <= 3
    assert speculative["tokens_per_target_decode"] >= 1
    assert speculative["by_source"]["model"]["drafted"] == speculative["drafted"]


def test_streamed_reply_is_the_whole_reply_in_pieces_with_statistics_last(chat_pair):
    with serving(chat_pair) as url:
        c = client(url)
        whole = ask(c, "hello there")
        chunks = list(ask(c, "hello there", stream=True))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == whole.choices[0].message.content
    *pieces, last = chunks
    assert all(chunk.choices[0].finish_reason is None for chunk in pieces)
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.model_extra["speculative"]["drafted"] > 0
    assert all("speculative" not in (chunk.model_extra or {}) for chunk in pieces)


def test_greedy_reply_is_the_one_speccli_chat_gives(chat_pair):
    result = CliRunner().invoke(
        cli_app, ["chat", "-m", str(chat_pair[0]), "-md", str(chat_pair[1]), "-t", "1", "--ctx", "256",
                  "-p", "hello there", "-n", "16", "--temp", "0", "--json"], catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    [record] = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    with serving(chat_pair) as url:
        reply = ask(client(url), "hello there")
    assert reply.choices[0].message.content == record["reply"]


def test_chat_messages_become_the_tokens_chat_would_feed(chat_pair):
    with Model(chat_pair[0], LoadOptions(n_ctx=256, n_threads=1)) as target:
        service = build_service(MODEL, target, None, ServeSettings(spec="ngram"))
        chat_format = chat_format_for(target.tokenizer)[0]
        for system in (None, "be brief"):
            conversation = Conversation(target.tokenizer, chat_format, system)
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "hi"}]
            assert service.chat_prompt(messages) == conversation.prompt_for("hi").tokens


def test_speculation_switched_per_request_keeps_greedy_output(chat_pair):
    with serving(chat_pair, k=2) as url:
        c = client(url)
        default = ask(c, "hello there")
        off = ask(c, "hello there", extra_body={"speculative": {"enabled": False}})
        chained = ask(c, "hello there", extra_body={"speculative": {"spec": "ngram+model", "k": 4}})
        auto = ask(c, "hello there", extra_body={"speculative": {"k": "auto"}})
    texts = {r.choices[0].message.content for r in (default, off, chained, auto)}
    assert len(texts) == 1  # greedy verification: the target's own greedy reply, however it was drafted
    off_figures = off.model_extra["speculative"]
    assert not off_figures["enabled"] and off_figures["spec"] is None and off_figures["drafted"] == 0
    assert chained.model_extra["speculative"]["spec"] == "ngram+model"
    assert chained.model_extra["speculative"]["k"] == 4
    assert set(chained.model_extra["speculative"]["by_source"]) <= {"ngram", "model"}
    assert max(map(int, chained.model_extra["speculative"]["draft_lengths"])) <= 4
    assert auto.model_extra["speculative"]["k"] == "auto"


def test_text_completion_of_a_raw_prompt_whole_and_streamed(chat_pair):
    with serving(chat_pair) as url:
        c = client(url)
        whole = c.completions.create(model=MODEL, prompt="once upon a time", **GREEDY)
        chunks = list(c.completions.create(model=MODEL, prompt="once upon a time", stream=True, **GREEDY))
    assert whole.object == "text_completion" and whole.usage.completion_tokens > 0
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert chunks[-1].model_extra["speculative"]["drafted"] == whole.model_extra["speculative"]["drafted"]


def test_a_completion_prompt_in_any_of_openais_forms(chat_pair):
    """Text, token ids, or a batch of one of either (as clients that batch send it) give the same reply;
    a batch of two, or an id past the vocabulary, is refused."""
    with Model(chat_pair[0], LoadOptions(n_ctx=256, n_threads=1)) as target:
        ids = target.tokenizer.tokenize("once upon a time", True, True)
    with serving(chat_pair) as url:
        c = client(url)
        replies = [c.completions.create(model=MODEL, prompt=prompt, **GREEDY).choices[0].text
                   for prompt in ("once upon a time", ["once upon a time"], ids, [ids])]
        two, error, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 4})
        past, past_error, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": [1, 10**6], "max_tokens": 4})
    assert len(set(replies)) == 1 and replies[0]
    assert_openai_error(two, error, 400)
    assert (error["error"]["param"], error["error"]["message"]) == ("prompt", "prompt: one prompt at a time, got 2")
    assert_openai_error(past, past_error, 400)
    assert past_error["error"]["message"] == "prompt: token id 1000000 is past this model's vocabulary of 512"


def test_a_reply_cut_while_it_writes_the_end_of_turn_marker_leaves_the_marker_out(tiny_dir):
    """As chat: without a chat template a reply ends at the next "\nUser:"; a pair whose every token is
    "\nUser", cut at 2 tokens, had answered "\nUser\nUser", the second the marker's beginning."""
    vocab = spm_vocabulary(512)
    vocab = replace(vocab, tokens=("\nUser",) + vocab.tokens[1:], token_types=(int(TokenType.NORMAL),) + vocab.token_types[1:],
                    unk_id=None)
    pair = write_related_pair(tiny_dir / "server_marker", target_layers=2, draft_layers=1,
                              config=TinyConfig(head_scale=0.0, vocab=vocab), name="server_marker")
    with serving(pair) as url:
        c = client(url)
        whole = ask(c, "hello", max_tokens=2)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in ask(c, "hello", max_tokens=2, stream=True))
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason, streamed) == ("\nUser", "length", "\nUser")


def test_stop_string_ends_the_reply_before_it(endless_pair):
    with serving(endless_pair) as url:
        reply = ask(client(url), "sing", max_tokens=12, stop=["la la"])
    assert reply.choices[0].finish_reason == "stop"
    assert "la la" not in reply.choices[0].message.content
    # The figures count what was returned: drafts past the stop are neither drafted nor kept.
    speculative = reply.model_extra["speculative"]
    assert speculative["accepted"] <= reply.usage.completion_tokens


def test_a_continuing_conversation_reuses_the_kv_cache(chat_pair):
    with serving(chat_pair) as url:
        c = client(url)
        first = ask(c, "hello there")
        again = ask(c, "hello there")
        history = [{"role": "user", "content": "hello there"},
                   {"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "and then?"}]
        follow_up = c.chat.completions.create(model=MODEL, messages=history, **GREEDY)
        switched = ask(c, "hello there", extra_body={"speculative": {"enabled": False}})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # The same prompt again: everything but the pending last token is already in the caches.
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert follow_up.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    assert switched.usage.prompt_tokens_details.cached_tokens == 0  # another drafting configuration: caches reset


def test_metrics_add_up_the_responses(chat_pair):
    with serving(chat_pair, k=3) as url:
        c = client(url)
        replies = [ask(c, text) for text in ("hello", "good morning", "how are you")]
        status, text = get(url, "/metrics")
    assert status == 200
    assert metric(text, 'requests_total{outcome="completed"}') == 3
    assert metric(text, "tokens_generated_total") == sum(r.usage.completion_tokens for r in replies)
    drafted = sum(r.model_extra["speculative"]["drafted"] for r in replies)
    accepted = sum(r.model_extra["speculative"]["accepted"] for r in replies)
    # Only per-source series: their sum is the total (an unlabeled total beside them would count twice).
    assert not re.search(r"^speccli_draft_tokens(_accepted)?_total ", text, re.MULTILINE)
    assert metric(text, 'draft_tokens_total{source="model"}') == drafted > 0
    assert metric(text, 'draft_tokens_accepted_total{source="model"}') == accepted
    assert metric(text, 'draft_position_drafted_total{position="1"}') > 0
    assert 'speccli_acceptance_by_position{position="1"}' in text
    steps = sum(r.model_extra["speculative"]["target_decodes"] for r in replies)
    assert sum(float(v) for v in re.findall(r'^speccli_k_chosen_total\{k="\d+"\} (\S+)$', text, re.MULTILINE)) == steps
    assert metric(text, "tokens_per_second") > 0
    for field, name in (("draft_seconds", "draft_seconds_total"), ("catch_up_seconds", "draft_catch_up_seconds_total"),
                        ("target_seconds", "target_seconds_total")):
        assert metric(text, name) == pytest.approx(sum(r.model_extra["speculative"][field] for r in replies), abs=1e-5)
    assert metric(text, "target_seconds_total") > 0


def test_time_to_first_token_counts_from_arrival_a_slow_prompt_included(chat_pair, monkeypatch):
    """The clock had started once the prompt was tokenized and its grammar compiled: a burst of requests
    whose schemas took seconds to compile showed a small time to the first token."""
    from speccli.server.service import Service

    tokenize = Service.text_prompt
    monkeypatch.setattr(Service, "text_prompt", lambda self, prompt: (time.sleep(0.3), tokenize(self, prompt))[1])
    with serving(chat_pair, k=3) as url:
        client(url).completions.create(model=MODEL, prompt="hello", max_tokens=2)
        text = get(url, "/metrics")[1]
    assert metric(text, "time_to_first_token_seconds_count") == 1
    assert metric(text, "time_to_first_token_seconds_sum") >= metric(text, "queue_wait_seconds_sum") >= 0.3


def test_responses_and_metrics_show_where_drafting_time_went_and_take_overs() -> None:
    # A model draft of 5 whose last 3 the lookup took over (after a catch-up), then a plain step.
    stats = RunStats()
    stats.add(StepEvent(5, 4, 0.5, 1.0, 0.1, "model", catch_up_seconds=0.2, continuation=("ngram", 3)))
    stats.add(StepEvent(0, 0, 0.0, 0.25, 0.05))
    summary = speculative_summary(stats, Speculation("ngram+model", "auto"))
    assert {key: summary[key] for key in ("take_overs", "draft_seconds", "catch_up_seconds", "target_seconds")} == {
        "take_overs": {"ngram": 1}, "draft_seconds": 0.5, "catch_up_seconds": 0.2, "target_seconds": 1.25,
    }
    assert set(summary) == {  # docs/server.md's field list
        "enabled", "spec", "k", "drafted", "accepted", "acceptance_rate", "acceptance_by_position", "target_decodes",
        "tokens_per_target_decode", "draft_lengths", "by_source", "take_overs", "decode_tokens_per_second",
        "prefill_seconds", "draft_seconds", "catch_up_seconds", "target_seconds",
    }
    metrics = Metrics()
    metrics.record(stats, "completed")
    metrics.record(stats, "completed")
    lines = set(metrics.render().splitlines())
    assert {
        'speccli_take_overs_total{source="ngram"} 2',
        "speccli_draft_seconds_total 1",
        "speccli_draft_catch_up_seconds_total 0.4",
        "speccli_target_seconds_total 2.5",
    } <= lines
    assert {f"# TYPE speccli_{name} counter" for name in ("take_overs_total", "draft_catch_up_seconds_total")} <= lines


@pytest.mark.gemma
def test_take_overs_and_catch_ups_of_real_requests_reach_the_metrics(gemma_pair, monkeypatch) -> None:
    # The tiny models never hand a draft over. Under `auto` whether a lookup takes the model's draft over
    # is priced on timings, which a loaded machine can shift (a CI run once saw none in three replies):
    # the policy here favours the lookups, so that each match takes over, whatever the machine.
    policies: list[LookupFavouredK] = []
    monkeypatch.setattr(worker_module, "make_policy", lambda k: policies.append(LookupFavouredK()) or policies[-1])
    tasks = {prompt.task: prompt.prompt for prompt in load_prompt_set(None).prompts}
    with serving_in_thread(build_service(MODEL, *gemma_pair, ServeSettings(port=0))) as url:
        c = client(url)
        replies = [ask(c, tasks[task], max_tokens=48) for task in ("json", "qa", "quote")]
        text = get(url, "/metrics")[1]
    figures = [reply.model_extra["speculative"] for reply in replies]
    assert {figure["spec"] for figure in figures} == {DEFAULT_SPEC}
    # The suffix source drafts from the context as `ngram` and from earlier replies as `suffix`.
    by_source = {source: sum(figure["take_overs"].get(source, 0) for figure in figures) for source in ("ngram", "suffix")}
    assert sum(by_source.values()) == sum(policy.taken_over for policy in policies) > 0
    for source, taken_over in by_source.items():
        line = f'take_overs_total{{source="{source}"}}'
        assert metric(text, line) == taken_over if taken_over else line not in text
    assert 'take_overs_total{source="model"}' not in text  # the model takes nothing over
    assert metric(text, "draft_catch_up_seconds_total") == pytest.approx(sum(f["catch_up_seconds"] for f in figures), abs=1e-5)


# --- bad input --------------------------------------------------------------------------------------


def assert_openai_error(status: int, body: dict, expected_status: int, code: str | None = None) -> None:
    assert status == expected_status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in error["message"]
    if code is not None:
        assert error["code"] == code


def test_malformed_requests_get_openai_errors_and_the_server_keeps_serving(chat_pair):
    good = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    bad_bodies = {
        "missing messages": {"model": MODEL},
        "empty messages": {**good, "messages": []},
        "message without content": {**good, "messages": [{"role": "user"}]},
        "unknown role": {**good, "messages": [{"role": "robot", "content": "hi"}]},
        "temperature out of range": {**good, "temperature": 5},
        "top_p zero": {**good, "top_p": 0},
        "negative top_k": {**good, "top_k": -1},
        "min_p one": {**good, "min_p": 1},
        "max_tokens zero": {**good, "max_tokens": 0},
        "two choices": {**good, "n": 2},
        "five stops": {**good, "stop": ["a", "b", "c", "d", "e"]},
        "k out of range": {**good, "speculative": {"k": 999}},
        "unknown spec": {**good, "speculative": {"spec": "oracle"}},
        "unknown extension field": {**good, "speculative": {"turbo": True}},
        "not an object": [1, 2],
        "negative seed": {**good, "seed": -2},  # -1 is llama-server's "random"
        "NaN temperature": {**good, "temperature": float("nan")},
        "max_tokens as a string": {**good, "max_tokens": "5"},
        "max_tokens as a boolean": {**good, "max_tokens": True},
        "stream as a string": {**good, "stream": "yes"},
    }
    with serving(chat_pair, n_ctx=256) as url:
        for path in ("/v1/chat/completions", "/v1/completions"):
            assert_openai_error(*post(url, path, b"{not json")[:2], 400)
        for name, body in bad_bodies.items():
            status, error, _ = post(url, "/v1/chat/completions", json.dumps(body))
            assert status == 400, name
            assert_openai_error(status, error, 400)
        assert post(url, "/v1/chat/completions", {**good, "temperature": 5})[1]["error"]["param"] == "temperature"
        # Each error names the request's own field, not pydantic's name for a type or union member.
        image = {**good, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
        for body, param, message in [
            (image, "messages.0.content.0.type", "Input should be 'text'"),
            ({**good, "speculative": {"k": 999}}, "speculative.k", 'must be "auto" or a whole number from 1 to 64, got 999'),
            ({**good, "speculative": {"k": "AUTO"}}, "speculative.k", "a whole number from 1 to 64, got 'AUTO'"),
            ({**good, "speculative": "ngram"}, "speculative", 'must be an object: {"spec": ..., "k": ...}, or'),
            ({**good, "speculative": {"enabled": False, "k": 4}}, "speculative",
             "enabled: false runs the target alone, which takes no spec or k; leave them out"),
            ({**good, "seed": -2}, "seed", "greater than or equal to -1"),
            ({**good, "max_completion_tokens": 7}, "max_completion_tokens", "differs from max_tokens (7 against 4): give one of them"),
            ({**good, "temperature": float("nan")}, "temperature", "Input should be a finite number"),
            # These had named pydantic's classes ("a valid dictionary or instance of TextPart"), or
            # said only one of the forms allowed ("Input should be a valid string").
            ({**good, "messages": [{"role": "user", "content": ["hi"]}]}, "messages.0.content.0",
             'must be an object: {"type": "text", "text": ...}'),
            ({**good, "messages": [{"role": "user", "content": None}]}, "messages.0.content",
             'must be text, or a list of text parts: {"type": "text", "text": ...}'),
            ({**good, "messages": ["hi"]}, "messages.0", 'must be an object: {"role": ..., "content": ...}'),
            ({**good, "stream": True, "stream_options": [1]}, "stream_options", 'must be an object: {"include_usage": true}'),
            ({"model": MODEL, "prompt": None}, "prompt", "must be text or token ids, or a list holding one of either"),
            ({"model": MODEL, "prompt": {}}, "prompt", "must be text or token ids, or a list holding one of either"),
            # A field nearly the request's own had been ignored as unknown ones are: its limit lost.
            ({**good, "max_token": 9}, "max_token", "max_token: not a field of this request; did you mean max_tokens?"),
            ({**good, "Stream": True}, "Stream", "did you mean stream?"),
            ({"model": MODEL, "prompt": "hi", "temprature": 0}, "temprature", "did you mean temperature?"),
        ]:
            path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
            error = post(url, path, json.dumps(body))[1]["error"]
            assert error["param"] == param and message in error["message"], error
            assert "Value error" not in error["message"] and "instance of" not in error["message"], error
        # Other servers' and newer APIs' fields are not taken for typos (vLLM's min_tokens is 0.8 of max_tokens:
        # at 0 it asks for nothing, and passes).
        assert post(url, "/v1/chat/completions", {**good, "min_tokens": 0, "store": False, "logit_bias_type": "input_ids"})[0] == 200
        assert_openai_error(*post(url, "/v1/completions", b'{"model": ' + b"[" * 5000)[:2], 400)
        gzipped = urllib.request.Request(url + "/v1/completions", data=gzip.compress(json.dumps(good).encode()),
                                         headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        with pytest.raises(urllib.error.HTTPError) as compressed:
            urllib.request.urlopen(gzipped, timeout=30)
        assert_openai_error(compressed.value.code, json.loads(compressed.value.read()), 415, "unsupported_content_encoding")
        # A body declared larger than 16 MiB is refused before any of it is read.
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as raw:
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n{" % (16 * 2**20 + 1))
            head, _, rest = raw.makefile("rb").read().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 ")
        assert_openai_error(413, json.loads(rest), 413, "request_too_large")
        assert_openai_error(*post(url, "/v1/completions", {"model": MODEL, "prompt": ""})[:2], 400)
        long_message = {**good, "messages": [{"role": "user", "content": "word " * 400}]}
        assert_openai_error(*post(url, "/v1/chat/completions", long_message)[:2], 400, "context_length_exceeded")
        status, error, _ = post(url, "/v1/chat/completions", {**good, "max_tokens": 1000})
        assert_openai_error(status, error, 400, "context_length_exceeded")
        assert error["error"]["param"] == "max_tokens"  # the prompt alone fits: the limit is what is at fault
        status, error, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "tools": [{"type": "function"}]})
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == "tools"
        unanswered = {**good, "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_1", "content": "4"}]}
        status, error, _ = post(url, "/v1/chat/completions", unanswered)
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == "messages.1.tool_call_id"
        assert error["error"]["message"] == "messages.1.tool_call_id: 'call_1' answers no call of the assistant's message before it"
        assert_openai_error(*post(url, "/v1/chat/completions", {**good, "model": "gpt-5"})[:2], 404, "model_not_found")
        status, body = get(url, "/v1/nothing-here")
        assert_openai_error(status, json.loads(body), 404)
        # The official client sees the same errors as its own exception types.
        c = client(url)
        with pytest.raises(openai.BadRequestError):
            ask(c, "hi", temperature=3)
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
        # ...and then serves as before.
        reply = ask(c, "hello there")
        assert reply.usage.completion_tokens > 0
        status, text = get(url, "/metrics")
        assert metric(text, 'requests_total{outcome="rejected"}') >= len(bad_bodies)


def test_what_openai_clients_send_and_expect(chat_pair):
    """Conventions of OpenAI's API that its clients rely on: a null is the default; a streamed reply with
    `stream_options.include_usage` ends with a chunk without choices that carries the usage, once; a model can
    be fetched by its id; an unknown path has code `unknown_url`; and a parameter this server cannot
    honour is refused (silently ignoring `logprobs` or `functions` would change what the reply means),
    while the values that ask for nothing pass."""
    good = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    asks_for_nothing = {"temperature": None, "top_p": None, "top_k": None, "min_p": None, "n": None, "stream": None,
                        "stream_options": None, "logprobs": False, "top_logprobs": None, "presence_penalty": 0,
                        "frequency_penalty": 0.0, "functions": [], "function_call": "none", "logit_bias": {},
                        "response_format": {"type": "text"}, "user": "someone",
                        # other servers' fields, at what asks for nothing; llama-server's seed -1: a random one
                        "repeat_penalty": 1.0, "typical_p": 1, "min_tokens": 0, "ignore_eos": False, "seed": -1}
    unsupported = {"logprobs": True, "top_logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": -1,
                   "functions": [{"name": "f"}], "function_call": {"name": "f"},
                   "logit_bias": {"17": 5}, "best_of": True,
                   # other servers' (llama-server's, vLLM's): ignored, the reply had looked as if they applied
                   "repeat_penalty": 1.1, "repetition_penalty": 1.2, "min_tokens": 8, "ignore_eos": True,
                   "guided_json": {"type": "object"}, "n_predict": 8, "mirostat": 2}
    with serving(chat_pair) as url:
        status, reply, _ = post(url, "/v1/chat/completions", {**good, **asks_for_nothing})
        assert status == 200 and reply["usage"]["completion_tokens"] > 0, reply
        for name, value in unsupported.items():
            status, error, _ = post(url, "/v1/chat/completions", {**good, name: value})
            assert_openai_error(status, error, 400, "unsupported_parameter")
            assert error["error"]["param"] == name and "not supported" in error["error"]["message"]
        for name, value in {"echo": True, "suffix": "end", "best_of": 2, "logprobs": 1}.items():
            status, error, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4, name: value})
            assert_openai_error(status, error, 400, "unsupported_parameter")
        c = client(url)
        chunks = list(ask(c, "hello there", stream=True, stream_options={"include_usage": True}))
        *_, finish, usage = chunks
        assert finish.choices[0].finish_reason is not None
        # The usage once (LangChain adds up every chunk's), on the last; the finish chunk keeps `speculative`.
        assert usage.choices == [] and usage.usage.completion_tokens > 0 and [chunk for chunk in chunks if chunk.usage] == [usage]
        assert finish.model_extra["speculative"] == usage.model_extra["speculative"]
        without = list(ask(c, "hello there", stream=True))
        assert without[-1].usage.completion_tokens == usage.usage.completion_tokens  # without it: on the finish chunk
        assert [chunk.choices[0].delta.content for chunk in without] == [chunk.choices[0].delta.content for chunk in chunks[:-1]]
        assert c.models.retrieve(MODEL).id == MODEL
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("gpt-5")
        status, error, _ = post(url, "/v1/chat/completions", {**good, "stream_options": {"include_usage": True}})
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == "stream_options"
        status, body = get(url, "/v1/nothing-here")
        assert_openai_error(status, json.loads(body), 404, "unknown_url")
        assert json.loads(body)["error"]["message"] == "no such path: GET /v1/nothing-here"
        for path in ("/v1/models/", f"/v1/models/{MODEL}/", "/v1/models/other/"):  # a trailing slash, not a model
            status, body = get(url, path)
            assert_openai_error(status, json.loads(body), 404, "unknown_url")


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def test_a_json_schema_reply_follows_the_schema_whole_streamed_and_at_any_temperature(chat_pair):
    """response_format json_schema (OpenAI's shape): every reply that stops is valid against the schema, a
    streamed one is the same text in pieces, and the grammar's forced tokens show as their own source."""
    form = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    with serving(chat_pair) as url:
        c = client(url)
        valid = 0
        for temperature in (0, 0.8, 1.5):
            for seed in range(3):
                reply = ask(c, "Describe someone", temperature=temperature, seed=seed, max_tokens=120, response_format=form)
                choice = reply.choices[0]
                if choice.finish_reason == "length":
                    continue
                assert choice.finish_reason == "stop"
                jsonschema.validate(json.loads(choice.message.content), PERSON)
                assert reply.model_extra["speculative"]["by_source"]["grammar"]["drafted"] > 0
                valid += 1
        assert valid >= 6
        whole = ask(c, "Describe someone", max_tokens=120, response_format=form).choices[0].message.content
        pieces = [chunk.choices[0].delta.content or "" for chunk in
                  ask(c, "Describe someone", max_tokens=120, response_format=form, stream=True) if chunk.choices]
        assert "".join(pieces) == whole
        status, reply, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 200, "temperature": 0,
                                                         "response_format": {"type": "json_object"}})
        assert status == 200 and isinstance(json.loads(reply["choices"][0]["text"]), dict), reply
        status, reply, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 20, "temperature": 0.8,
                                                         "grammar": 'root ::= ("yes" | "no") "!"'})
        assert status == 200 and reply["choices"][0]["text"] in ("yes!", "no!"), reply
        # llama-server's top-level json_schema, as its clients send it (it had been ignored: free text)
        status, reply, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 20, "temperature": 0.8,
                                                         "json_schema": {"enum": ["yes", "no"]}})
        assert status == 200 and json.loads(reply["choices"][0]["text"]) in ("yes", "no"), reply
        # and its response_format {"type": "json_object", "schema": ...} (instructor's JSON_SCHEMA mode): the
        # schema had been dropped, any JSON object served as if it applied
        status, reply, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 20, "temperature": 0.8,
                                                         "response_format": {"type": "json_object", "schema": {"enum": ["yes", "no"]}}})
        assert status == 200 and json.loads(reply["choices"][0]["text"]) in ("yes", "no"), reply


def test_a_reply_cut_mid_structure_is_length_never_stop(chat_pair):
    form = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    with serving(chat_pair) as url:
        reply = ask(client(url), "Describe someone", max_tokens=5, response_format=form)
        assert reply.choices[0].finish_reason == "length"
        with pytest.raises(json.JSONDecodeError):
            json.loads(reply.choices[0].message.content)


@pytest.mark.parametrize("fields, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format", "response_format.json_schema.schema: at /type: Invalid type: objekt"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"a": {"not": {}}}}}}},
     "response_format", 'response_format.json_schema.schema: at /properties/a/not: Unimplemented keys: ["not"]'),
    ({"response_format": {"type": "json_schema"}}, "response_format",
     'response_format: json_schema: give it with type "json_schema" and only then'),
    ({"response_format": {"type": "xml"}}, "response_format.type", None),
    ({"response_format": {"type": "json_object", "schema": {"type": "objekt"}}},
     "response_format", "response_format.schema: at /type: Invalid type: objekt"),
    ({"response_format": {"type": "text", "schema": {"type": "object"}}}, "response_format",
     'response_format: schema: give it with type "json_object" (llama-server\'s form), or as json_schema.schema'),
    ({"grammar": 'root ::= "a" missing'}, "grammar", "grammar: Failed to convert the grammar from GBNF to Lark: Rule 'missing' not found"),
    ({"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}, "grammar", "response_format and grammar: give one of them"),
    # llama-server's own field for a schema is served, and checked as response_format's is.
    ({"json_schema": {"type": "objekt"}}, "json_schema", "json_schema: at /type: Invalid type: objekt"),
    ({"json_schema": {"type": "object"}, "grammar": "root ::= \"a\""}, "json_schema", "grammar and json_schema: give one of them"),
    # A stop string would cut the reply short of valid, yet it would end as "stop".
    ({"response_format": {"type": "json_object"}, "stop": ","}, "stop",
     "stop: a reply that follows response_format would be cut by a stop string before it is complete; leave stop out"),
    ({"grammar": 'root ::= "a"+', "stop": ["aa"]}, "stop",
     "stop: a reply that follows grammar would be cut by a stop string before it is complete; leave stop out"),
    # llguidance takes a schema that only refers to itself, but nothing may begin its reply.
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}}},
     "response_format", "response_format.json_schema.schema: no text satisfies it (nothing may begin a reply)"),
    # Too big for llguidance's limits, which show only with the vocabulary: refused in about a second.
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": [f"v{i}" for i in range(100_000)]}}}},
     "response_format", "response_format.json_schema.schema: initial lexer configuration (grammar) too big (limit for this grammar: 1000000)"),
])
def test_a_schema_or_grammar_that_cannot_be_compiled_is_a_400_naming_it_and_the_server_serves_on(chat_pair, fields, param, message):
    with serving(chat_pair) as url:
        status, error, _ = post(url, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                              "max_tokens": 4, **fields})
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == param
        if message is not None:
            assert error["error"]["message"] == message
        assert ask(client(url), "hi", max_tokens=4).choices[0].finish_reason in ("stop", "length")


def test_a_spec_needing_a_draft_is_refused_when_the_server_has_none(chat_pair):
    with Model(chat_pair[0], LoadOptions(n_ctx=256, n_threads=1)) as target:
        service = build_service(MODEL, target, None, ServeSettings(spec="ngram"))
        assert service.speculation_for(SpeculationControl(k=2)) == Speculation("ngram", 2)
        with pytest.raises(APIError) as refused:
            service.speculation_for(SpeculationControl(spec="ngram+model"))
    assert refused.value.status == 400 and "needs a draft model" in refused.value.message


# --- one sequence at a time -------------------------------------------------------------------------


def test_a_draft_whose_logits_are_nan_is_a_500_naming_it_and_the_server_serves_on(chat_pair, tmp_path):
    """NaN logits had reached the client as the raw exception ("internal error: ValueError: zero-size array
    to reduction operation maximum which has no identity"), with its traceback in the log."""
    broken = (chat_pair[0], poisoned_copy(chat_pair[1], tmp_path / "nan-draft.gguf"))
    with serving(broken) as url:
        request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0.8, "max_tokens": 8}
        status, body, _ = post(url, "/v1/chat/completions", request)
        assert_openai_error(status, body, 500)
        assert body["error"]["message"] == ("nan-draft.gguf (the draft model): its logits are not finite (NaN or "
                                            "infinity), so no token can be drawn from them; check the file against its source")
        assert body["error"]["type"] == "server_error"
        c = client(url)
        with pytest.raises(openai.InternalServerError):
            ask(c, "hi", temperature=0.8)
        reply = ask(c, "hi", temperature=0.8, extra_body={"speculative": {"enabled": False}})  # the target alone
        assert reply.usage.completion_tokens > 0
        assert metric(get(url, "/metrics")[1], 'requests_total{outcome="error"}') == 2


def test_a_client_leaving_before_its_body_is_all_sent_is_counted_cancelled_without_a_traceback(chat_pair, capfd):
    """A body declared 1000 bytes long, 9 sent, then the connection closed: Starlette's ClientDisconnect had
    reached the log as a 45-line traceback."""
    with serving(chat_pair) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as raw:
            raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n{\"model\":")
        text = await_metrics(url, lambda text: metric(text, 'requests_total{outcome="cancelled"}') >= 1, "the request was not counted as cancelled")
        assert metric(text, 'requests_total{outcome="error"}') == 0
        assert ask(client(url), "hi").usage.completion_tokens > 0
    assert "Traceback" not in capfd.readouterr().err


def test_a_client_leaving_mid_stream_cancels_its_generation(endless_pair):
    with serving(endless_pair, n_ctx=LONG_CTX) as url:
        c = client(url)
        stream = ask(c, "sing", stream=True, max_tokens=LONG_REPLY)
        received = [chunk for _, chunk in zip(range(4), stream)]
        stream.close()
        assert len(received) == 4
        text = await_metrics(url, lambda text: metric(text, 'requests_total{outcome="cancelled"}') >= 1, "the generation was not cancelled")
        assert metric(text, "tokens_generated_total") < LONG_REPLY  # it stopped early, not at max_tokens
        reply = ask(c, "sing", max_tokens=6)
    assert reply.choices[0].message.content == "la la la la la la "
    assert reply.choices[0].finish_reason == "length"


def test_a_client_leaving_while_queued_is_skipped_without_generating(endless_pair):
    with serving(endless_pair, n_ctx=LONG_CTX, max_waiting=2) as url:
        c = client(url)
        busy = ask(c, "sing", stream=True, max_tokens=LONG_REPLY)  # holds the one generation slot
        next(iter(busy))
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": LONG_REPLY})
        with socket.create_connection((host, int(port))) as waiting:
            waiting.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
            time.sleep(0.3)  # it is queued behind the busy stream by now
        time.sleep(0.2)  # and the server has seen it leave
        busy.close()
        text = await_metrics(url, lambda text: metric(text, 'requests_total{outcome="cancelled"}') >= 2, "the queued request was not cancelled")
        assert metric(text, 'requests_total{outcome="completed"}') == 0
        assert metric(text, "tokens_generated_total") < LONG_REPLY
        after = ask(c, "sing", max_tokens=3)
    assert after.choices[0].message.content == "la la la "
    # Only the busy stream's prompt was ever read: the queued one never reached the models.
    assert metric(text, "prompt_tokens_total") == after.usage.prompt_tokens


def test_a_client_leaving_the_queue_frees_its_place_at_once(endless_pair):
    """One place in the queue: a client that waits there and leaves gives it up at once, so the next
    request waits in it (served once the busy stream ends) rather than being refused with 503."""
    with serving(endless_pair, n_ctx=LONG_CTX, max_waiting=1) as url:
        c = client(url)
        busy = ask(c, "sing", stream=True, max_tokens=LONG_REPLY)  # holds the one generation slot
        next(iter(busy))
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        with socket.create_connection((host, int(port))) as waiting:
            waiting.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
            await_metrics(url, lambda text: metric(text, "queue_waiting") >= 1, "the request never queued")
        await_metrics(url, lambda text: metric(text, "queue_waiting") <= 0, "the place was not given up")
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(ask, c, "sing", max_tokens=3)  # a 503 while a leaver still held the place
            deadline = time.monotonic() + 10
            while metric(get(url, "/metrics")[1], "queue_waiting") < 1:
                assert time.monotonic() < deadline and not queued.done(), "the next request did not queue"
                time.sleep(0.02)
            busy.close()
            reply = queued.result(timeout=60)
    assert reply.choices[0].message.content == "la la la "


def test_load_eight_clients_four_requests_each_none_lost_or_mixed(chat_pair):
    prompts = {(client_id, n): f"client {client_id} asks question {n}" for client_id in range(8) for n in range(4)}
    with serving(chat_pair, max_waiting=8) as url:
        c = client(url)
        alone = {key: ask(c, text, max_tokens=12).choices[0].message.content for key, text in prompts.items()}

        def one_client(client_id: int) -> dict[tuple[int, int], str]:
            own = client(url)
            texts = {}
            for n in range(4):  # every other request streamed
                if n % 2:
                    stream = ask(own, prompts[client_id, n], max_tokens=12, stream=True)
                    texts[client_id, n] = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
                else:
                    texts[client_id, n] = ask(own, prompts[client_id, n], max_tokens=12).choices[0].message.content
            return texts

        with ThreadPoolExecutor(8) as pool:
            together = {key: text for texts in pool.map(one_client, range(8)) for key, text in texts.items()}
        completed = metric(get(url, "/metrics")[1], 'requests_total{outcome="completed"}')
    assert together == alone  # all 32 answered, each with its own prompt's reply
    assert completed == 64


def test_a_full_queue_answers_503_with_retry_after_rather_than_hanging(endless_pair):
    with serving(endless_pair, n_ctx=8192, max_waiting=1) as url:
        c = client(url)

        def attempt(_: int) -> str:
            try:
                stream = ask(c, "sing", stream=True, max_tokens=3000)
            except openai.APIStatusError as error:
                assert error.status_code == 503 and error.response.headers["retry-after"] == "1"
                assert error.body["code"] == "queue_full"
                return "refused"
            with stream:
                return "served" if sum(1 for _ in stream) else "empty"

        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(attempt, range(4)))
        assert time.monotonic() - started < 60
        assert outcomes.count("refused") >= 2  # one runs, one waits, the rest are refused at once
        assert outcomes.count("served") >= 1 and "empty" not in outcomes
        assert metric(get(url, "/metrics")[1], 'requests_total{outcome="queue_full"}') == outcomes.count("refused")


def test_a_queue_of_zero_serves_one_request_at_a_time_and_refuses_the_rest(endless_pair):
    with serving(endless_pair, n_ctx=8192, max_waiting=0) as url:
        c = client(url)
        assert ask(c, "sing", max_tokens=3).choices[0].message.content  # idle: served, not refused

        def attempt(_: int) -> str:
            try:
                stream = ask(c, "sing", stream=True, max_tokens=3000)
            except openai.APIStatusError as error:
                assert error.status_code == 503
                return "refused"
            with stream:
                return "served" if sum(1 for _ in stream) else "empty"

        with ThreadPoolExecutor(2) as pool:  # with one place to wait in, both would be served
            outcomes = list(pool.map(attempt, range(2)))
        assert sorted(outcomes) == ["refused", "served"]


def test_a_prompt_being_tokenized_holds_its_place_in_the_queue(endless_pair):
    """--queue bounds the prompts being tokenized too: a prompt of millions of tokens costs hundreds of
    MB until it is found too long, and had no bound while clients sent many at once."""
    with serving(endless_pair, n_ctx=8192, max_waiting=0) as url:
        c = client(url)
        with ThreadPoolExecutor(1) as pool:
            huge = pool.submit(ask, c, "la " * 5_000_000, max_tokens=1)  # 15 MB: seconds to tokenize
            await_metrics(url, lambda text: metric(text, "queue_waiting") >= 1, "the huge prompt took no place")
            with pytest.raises(openai.APIStatusError) as refused:
                ask(c, "sing", max_tokens=1)
            with pytest.raises(openai.BadRequestError) as too_long:
                huge.result(timeout=120)
        assert refused.value.status_code == 503 and refused.value.body["code"] == "queue_full"
        assert too_long.value.body["code"] == "context_length_exceeded"
        assert metric(get(url, "/metrics")[1], "queue_waiting") == 0  # its place was given back
        assert ask(c, "sing", max_tokens=3).choices[0].message.content == "la la la "


# --- an API key ------------------------------------------------------------------------------------------


KEY = "sk-test-0123456789"


def get_with(url: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_an_api_key_is_asked_for_on_every_path_but_health(chat_pair):
    with serving(chat_pair, api_key=KEY) as url:
        keyed = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)
        assert ask(keyed, "hello").usage.completion_tokens > 0
        assert [m.id for m in keyed.models.list()] == [MODEL]
        with pytest.raises(openai.AuthenticationError) as refused:
            ask(client(url), "hello")  # "unused", the key an open server takes
        assert refused.value.status_code == 401
        assert refused.value.body == {"message": "incorrect API key provided", "type": "invalid_request_error",
                                      "param": None, "code": "invalid_api_key"}
        for headers in ({}, {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer"}):
            status, body = get_with(url, "/v1/models", headers)
            assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", headers
        assert json.loads(get_with(url, "/v1/models", {})[1])["error"]["message"].startswith("no API key provided")
        assert get(url, "/metrics")[0] == 401
        host, port = url.removeprefix("http://").split(":")
        for keys in ((KEY, "wrong"), ("wrong", KEY)):  # the last had counted: a right key after a wrong one got in
            with socket.create_connection((host, int(port)), timeout=30) as raw:
                raw.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                            + b"".join(b"Authorization: Bearer %s\r\n" % key.encode() for key in keys) + b"\r\n")
                head, _, rest = raw.makefile("rb").read().partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 401 ") and json.loads(rest)["error"]["message"] == "more than one Authorization header"
        status, text = get_with(url, "/metrics", {"Authorization": f"bearer {KEY}"})  # the scheme in any case
        assert status == 200 and metric(text, 'requests_total{outcome="rejected"}') == 8
        assert get(url, "/health")[0] == 200  # a load balancer's probe needs no key


@pytest.mark.parametrize("args, env, line", [
    (["--api-key", ""], {}, "error: --api-key is empty; give a key, or leave it out to serve without one"),
    ([], {"SPECCLI_API_KEY": ""}, "error: SPECCLI_API_KEY is empty; give a key, or unset it to serve without one"),
    (["--api-key", "two words"], {}, "error: --api-key must be printable ASCII without spaces, as an HTTP header carries it"),
], ids=["--api-key ''", "SPECCLI_API_KEY=''", "a space"])
def test_an_empty_api_key_is_refused_before_anything_loads(args, env, line):
    result = CliRunner(env=env).invoke(cli_app, ["serve", "-m", "/nonexistent/model.gguf", "--port", "0", *args])
    assert (result.exit_code, result.stderr) == (1, line + "\n")  # a value refused (docs/cli.md)


def test_listening_beyond_loopback_without_a_key_is_warned_of_at_start():
    for address in ("127.0.0.1", "127.0.0.2", "::1"):
        assert exposure_warning(address, address, None) is None
    for address in ("0.0.0.0", "::", "192.0.2.7", "fe80::1%eth0"):
        assert exposure_warning(address, address, None).startswith(f"warning: --host {address} is reachable beyond")
        assert exposure_warning(address, address, KEY) is None
    # The real command, bound to every interface for as long as it takes to find the model missing.
    env = {key: value for key, value in os.environ.items() if key != "SPECCLI_API_KEY"}
    command = [sys.executable, "-m", "speccli", "serve", "-m", "/nonexistent/model.gguf", "--host", "0.0.0.0", "--port", "0"]
    done = subprocess.run(command, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "warning: --host 0.0.0.0 is reachable beyond this machine and no API key is asked for: anyone who reaches it "
        "can use the models (set SPECCLI_API_KEY, or --api-key)",
        "error: /nonexistent/model.gguf: no such file",
    ]
    done = subprocess.run(command, env={**env, "PYTHONPATH": str(REPO), "SPECCLI_API_KEY": KEY}, capture_output=True,
                          text=True, timeout=60)
    assert done.stderr.splitlines() == ["error: /nonexistent/model.gguf: no such file"]


def test_serve_takes_its_key_from_the_environment_out_of_ps(chat_pair):
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPECCLI_API_KEY": KEY}
    command = [sys.executable, "-m", "speccli", "serve", "-m", str(chat_pair[0]), "-md", str(chat_pair[1]),
               "--port", "0", "-t", "1", "--ctx", "64"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        match = re.search(r"256-token context, API key required\) at (http://127\.0\.0\.1:\d+)/v1", line)
        assert match, line
        assert KEY.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
        url = match.group(1)
        with pytest.raises(openai.AuthenticationError):
            client(url).models.list()
        keyed = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)
        assert [m.id for m in keyed.models.list()] == [chat_pair[0].stem]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


# --- the command --------------------------------------------------------------------------------------


@pytest.mark.parametrize("interrupt", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_command_prints_its_loopback_url_serves_and_stops_on_ctrl_c(chat_pair, interrupt):
    """A server's usual end is Ctrl-C or a service manager's SIGTERM: exit 0 either way."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "speccli", "serve", "-m", str(chat_pair[0]), "-md", str(chat_pair[1]),
               "--port", "0", "-t", "1", "--ctx", "64", "--k", "2"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        match = re.search(r"\(--spec suffix\+model, --k 2, 256-token context\) at (http://127\.0\.0\.1:\d+)/v1", line)
        assert match, line  # llama.cpp rounded --ctx 64 up to 256, and the line says so
        c = client(match.group(1))
        [served] = [model.id for model in c.models.list()]
        assert served == chat_pair[0].stem  # a model given as a path is served by its file name
        reply = c.chat.completions.create(model=served, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert reply.model_extra["speculative"]["k"] == 2
        process.send_signal(interrupt)
        assert process.wait(timeout=20) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_a_remembering_server_owns_its_store_clear_waits_for_it_and_a_second_keeps_its_own_in_memory(chat_pair, tmp_path):
    """`remembered --clear` while a server ran reported success, and the server wrote every reply back at
    its next save; two servers on one store overwrote each other's. Now the first holds the store: the
    second is told and writes nothing, --clear refuses naming the writer and deletes nothing, and once
    the servers stop it deletes all."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPECCLI_CACHE_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "speccli", "serve", "-m", str(chat_pair[0]), "-md", str(chat_pair[1]),
               "--port", "0", "-t", "1", "--ctx", "64", "--remember"]
    body = {"model": chat_pair[0].stem, "messages": [{"role": "user", "content": "hi"}], **GREEDY}
    servers = []
    try:
        for _ in range(2):
            servers.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True))
            lines = [servers[-1].stderr.readline()]
            while "serving" not in lines[-1] and lines[-1]:
                lines.append(servers[-1].stderr.readline())
            url = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", lines[-1]).group(1)
            assert post(url, "/v1/chat/completions", body)[0] == 200
            if len(servers) == 1:  # the reply is sent, then saved
                deadline = time.monotonic() + 10
                while not (stores := list((tmp_path / "remembered").glob("*.suffix"))) and time.monotonic() < deadline:
                    time.sleep(0.01)
                [store] = stores
                first_replies = store.read_bytes()
        assert lines[:-1] == [f"warning: {store}: in use by another speccli process (pid {servers[0].pid}); this one "
                              "drafts from it too but keeps its own replies in memory only\n"]
        cleared = CliRunner().invoke(cli_app, ["remembered", "--clear"], env={"SPECCLI_CACHE_DIR": str(tmp_path)})
        assert (cleared.exit_code, cleared.stdout) == (1, "")
        assert cleared.stderr == (f"error: {store.name} is written by a running speccli process (pid {servers[0].pid}): "
                                  "stop it (chat or serve with --remember), then clear; nothing was deleted\n")
        listed = CliRunner().invoke(cli_app, ["remembered"], env={"SPECCLI_CACHE_DIR": str(tmp_path)})
        assert f"(in use by pid {servers[0].pid})" in listed.stdout
        for server in servers:
            server.send_signal(signal.SIGINT)
            assert server.wait(timeout=20) == 0
        assert store.read_bytes() == first_replies  # the second server wrote nothing over them
        cleared = CliRunner().invoke(cli_app, ["remembered", "--clear"], env={"SPECCLI_CACHE_DIR": str(tmp_path)})
        assert (cleared.exit_code, list((tmp_path / "remembered").glob("*.suffix"))) == (0, [])
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()


def test_a_file_name_that_is_not_utf8_is_served_under_an_escaped_id():
    """/health and /v1/models answered 500 (a traceback in the log): JSON carries text only."""
    from speccli.server.launch import model_id_for

    assert model_id_for("/m/h\udcffx.gguf") == "h\\udcffx"
    json.dumps(model_id_for("/m/h\udcffx.gguf")).encode()


def test_the_queue_admits_fills_withdraws_and_stops_by_its_rules_without_a_thread(tiny_model):
    """Worker.admit / submit / withdraw / cancel / stop / lose, driven directly (no generation thread, a
    model that never decodes): --queue 1 is one place running and one waiting; a stop tells each waiting
    job why (503) and refuses every later request; a lost server refuses with its reason."""
    from speccli.server.worker import Job, LostError, QueueFullError, ShuttingDownError, StoppedGeneration, Worker

    loop = asyncio.new_event_loop()
    try:
        metrics = Metrics()
        model = Model(tiny_model, LoadOptions(n_ctx=64, n_threads=1))
        worker = Worker(model, None, max_waiting=1, metrics=metrics)

        def job() -> Job:
            return Job([1], GenerationLimits(4), SamplingParams(), None, Speculation(None, None), loop)

        def waiting() -> float:
            return metric(metrics.render(), "queue_waiting")

        def outcome(name: str) -> float:
            return metric(metrics.render(), f'requests_total{{outcome="{name}"}}')

        worker.admit()
        worker.admit()
        assert waiting() == 2
        with pytest.raises(QueueFullError):
            worker.admit()  # the two places are taken while their prompts are tokenized
        worker.withdraw()  # a prompt refused as it was tokenized gives its place back
        assert waiting() == 1
        first, second = job(), job()
        worker.submit(first)
        assert waiting() == 1
        worker.admit()
        worker.submit(second)
        worker.cancel(first)  # its client left while it waited: its place is free at once
        assert (waiting(), outcome("cancelled"), first.cancelled.is_set()) == (1, 1, True)
        worker.stop()
        loop.run_until_complete(asyncio.sleep(0))  # the events are handed over on the job's loop
        assert isinstance(second.events.get_nowait(), StoppedGeneration) and second.cancelled.is_set()
        assert (waiting(), outcome("cancelled")) == (0, 2)
        with pytest.raises(ShuttingDownError):
            worker.admit()
        lost = Worker(model, None, max_waiting=1, metrics=Metrics())
        lost.lose("the RPC server at 10.0.0.2:50052 went away")
        with pytest.raises(LostError, match="went away"):
            lost.admit()
    finally:
        loop.close()


@pytest.mark.parametrize("gap", [0.12, 0.25])
def test_ctrl_c_pressed_twice_is_one_clean_stop(chat_pair, gap):
    """The second Ctrl-C, while the server stops, changes nothing: uvicorn had skipped the app's shutdown
    on it and printed the lifespan's CancelledError traceback (0.12 s), or, once it had put the handlers
    back, the signal killed the process mid-teardown (0.25 s)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "speccli", "serve", "-m", str(chat_pair[0]), "-md", str(chat_pair[1]),
               "--port", "0", "-t", "1", "--ctx", "64"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", process.stderr.readline()).group(1)
        assert get(url, "/health")[0] == 200  # serving: uvicorn has taken the signals over
        process.send_signal(signal.SIGINT)
        time.sleep(gap)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        assert process.stderr.read() == ""
    finally:
        if process.poll() is None:
            process.kill()


def test_only_a_json_body_is_read_since_a_web_page_can_post_other_types_unasked(chat_pair):
    """A browser posts text/plain, a form or a body without a type to any address with no CORS preflight:
    read as JSON, a page the user visits could make a key-less local server generate (and, with
    --remember, write into the store). Such a post is 415, naming its type; the request is not run."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **GREEDY})
    with serving(chat_pair, n_ctx=256) as url:
        host, port = url.removeprefix("http://").split(":")

        def post_as(content_type: str | None) -> tuple[int, dict]:
            connection = http.client.HTTPConnection(host, int(port), timeout=30)  # adds no Content-Type itself
            headers = {"Origin": "http://evil.example", **({"Content-Type": content_type} if content_type else {})}
            connection.request("POST", "/v1/chat/completions", body, headers)
            response = connection.getresponse()
            return response.status, json.loads(response.read())

        for refused in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None,
                        "application/json\xa0", "text/json", "application/jsonx"):
            status, error = post_as(refused)
            assert_openai_error(status, error, 415, "unsupported_media_type")
            assert (repr(refused) if refused else "no Content-Type") in error["error"]["message"]
        assert metric(get(url, "/metrics")[1], "tokens_generated_total") == 0
        for accepted in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
            assert post_as(accepted)[0] == 200


def test_odd_paths_methods_and_text_get_openai_errors(chat_pair):
    with serving(chat_pair, n_ctx=256) as url:
        # A lone surrogate escape parses to a str no tokenizer can encode: it had been a 500 with a traceback.
        status, error, _ = post(url, "/v1/chat/completions",
                               b'{"model": "tiny", "messages": [{"role": "user", "content": "hi \\ud800"}], "max_tokens": 2}')
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == "messages.0.content"
        assert error["error"]["message"].startswith("messages.0.content: holds a lone UTF-16 surrogate escape")
        # So may a call's arguments sent back in the history, escaped inside their text (a 500 too).
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": {"\\ud800": 1}}'}}
        status, error, _ = post(url, "/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]})
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == "messages.1.tool_calls.0.function.arguments"
        assert "lone UTF-16 surrogate escape" in error["error"]["message"]
        # A wrong method names the right one, in the Allow header too.
        request = urllib.request.Request(url + "/v1/chat/completions", method="GET")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == 405 and caught.value.headers["allow"] == "POST"
        assert json.loads(caught.value.read())["error"]["message"] == "GET /v1/chat/completions: not allowed; use POST"
        # A trailing slash is an unknown path, not a redirect to the Host header's address.
        status, error, headers = post(url, "/v1/chat/completions/", {"model": MODEL})
        assert_openai_error(status, error, 404, "unknown_url")
        assert "location" not in {name.lower() for name in headers}
        # ...in a key too, which the message names escaped (it had broken the JSON response: a 500).
        status, error, _ = post(url, "/v1/chat/completions", b'{"model": "tiny", "metadata": {"\\ud800": "\\ud800"}}')
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == "metadata.\\ud800"
        # A key alone: a tool's parameter named so is written into the prompt by the template.
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"\ud800": {}}}}}
        body = json.dumps({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]})
        status, error, _ = post(url, "/v1/chat/completions", body.encode())
        assert_openai_error(status, error, 400)
        assert error["error"]["param"] == "tools.0.function.parameters.properties.\\ud800"
        # A number of 5,000 digits, past Python's int conversion limit: it had been a 500, then "should be a
        # valid integer" (or, as a token id, "must be whole numbers").
        huge = b"1" + b"0" * 5000
        for field, body in [("max_tokens", b'{"model": "tiny", "prompt": "hi", "max_tokens": %s}' % huge),
                            ("seed", b'{"model": "tiny", "prompt": "hi", "seed": %s}' % huge),
                            ("prompt.1", b'{"model": "tiny", "prompt": [1, %s]}' % huge)]:
            status, error, _ = post(url, "/v1/completions", body)
            assert_openai_error(status, error, 400)
            assert error["error"]["param"] == field
            assert error["error"]["message"] == f"{field}: a whole number of over 4,300 digits, past every limit here"
        # Every 4xx counts: the surrogates (four), the wrong method, the unknown path, the numbers (the 404 and 405 had not).
        assert metric(get(url, "/metrics")[1], 'requests_total{outcome="rejected"}') == 9


def test_a_shutdown_is_told_from_lost_models_by_type_not_by_message() -> None:
    from speccli.server.api_errors import SHUTTING_DOWN_CODE, UNAVAILABLE_CODE, api_error_for
    from speccli.server.worker import SHUTTING_DOWN, GenerationError, LostGeneration, StoppedGeneration

    assert api_error_for(StoppedGeneration()).code == SHUTTING_DOWN_CODE
    lost = api_error_for(LostGeneration(SHUTTING_DOWN))  # a reason that happens to read like a shutdown
    assert (lost.status, lost.code) == (503, UNAVAILABLE_CODE)
    failed = api_error_for(GenerationError("the context is full", status=500))
    assert (failed.status, failed.code) == (500, None)


def test_requests_running_waiting_or_arriving_as_the_server_stops_get_503_each_counted_once(endless_pair):
    """Submitted to a worker already stopped, a request had waited out the graceful shutdown; a running
    one's 503 had been counted as queue_full, beside the worker's own count."""
    with ExitStack() as stack:
        options = LoadOptions(n_ctx=8192, n_threads=1)
        target = stack.enter_context(Model(endless_pair[0], options))
        service = build_service(MODEL, target, None, ServeSettings(port=0, spec="ngram", k=3))
        url = stack.enter_context(serving_in_thread(service))
        body = {"model": MODEL, "prompt": "sing", "max_tokens": 7000, "temperature": 0}
        request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as stream, ThreadPoolExecutor(1) as pool:
            [stream.readline() for _ in range(4)]  # running
            waiting = pool.submit(post, url, "/v1/completions", body)
            await_metrics(url, lambda text: metric(text, "queue_waiting") >= 1, "the second request never queued")
            service.worker.stop()
            assert b"server_shutting_down" in stream.read()
            assert_openai_error(*waiting.result(timeout=30)[:2], 503, "server_shutting_down")
        status, error, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": "sing", "max_tokens": 2})
        assert_openai_error(status, error, 503, "server_shutting_down")
        text = get(url, "/metrics")[1]
        assert metric(text, 'requests_total{outcome="cancelled"}') == 3
        assert metric(text, 'requests_total{outcome="queue_full"}') == 0  # a shutdown's 503 had counted as one


def test_stopping_the_server_stops_a_long_prompts_prefill_between_batches(endless_pair):
    """A long prompt is decoded a batch at a time, and the shutdown (or a client leaving) is heeded
    between batches: it had waited for the whole prefill, tens of seconds for a long prompt on a CPU."""
    with ExitStack() as stack:
        options = LoadOptions(n_ctx=8192, n_threads=1, n_batch=64)
        target = stack.enter_context(Model(endless_pair[0], options))
        service = build_service(MODEL, target, None, ServeSettings(port=0, spec="ngram", k=3))
        url = stack.enter_context(serving_in_thread(service))
        decoding, release, decodes = threading.Event(), threading.Event(), []
        real_decode = target.decode_together

        def held_decode(parts):  # the first batch waits until the shutdown has begun
            decodes.append(sum(len(tokens) for _, tokens, _ in parts))
            decoding.set()
            release.wait(timeout=30)
            return real_decode(parts)

        target.decode_together = held_decode
        with ThreadPoolExecutor(2) as pool:
            answer = pool.submit(post, url, "/v1/completions", {"model": MODEL, "prompt": "sing " * 1000, "max_tokens": 2})
            assert decoding.wait(timeout=30)
            stopping = pool.submit(service.worker.stop)
            deadline = time.monotonic() + 10
            while not service.worker.running[0].cancelled.is_set():
                assert time.monotonic() < deadline, "the running request was never cancelled"
                time.sleep(0.01)
            release.set()
            stopping.result(timeout=30)
            assert_openai_error(*answer.result(timeout=30)[:2], 503, "server_shutting_down")
        assert decodes == [64]  # one batch of the prompt's ~1,000 tokens, then no more
        assert metric(get(url, "/metrics")[1], 'requests_total{outcome="cancelled"}') == 1


@pytest.mark.parametrize("interrupt", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_the_server_ends_a_running_stream_and_answers_waiting_requests(endless_pair, interrupt):
    """They had waited out the graceful shutdown (the stream still growing), then been cancelled: a
    stream cut without its end, a plain-text 500 for a waiting request, tracebacks in the log. A
    waiting request that asked to stream gets the 503 too: its stream never began."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "speccli", "serve", "-m", str(endless_pair[0]), "-md", str(endless_pair[1]),
               "--port", "0", "-t", "1", "--ctx", "8192", "--k", "4", "--queue", "2"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", process.stderr.readline()).group(1)
        body = {"model": endless_pair[0].stem, "messages": [{"role": "user", "content": "sing"}], "max_tokens": 7000,
                "temperature": 0}  # greedy: "la la ..." with no end (sampled, it may end at a stop string)
        request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as stream, ThreadPoolExecutor(2) as pool:
            events = [stream.readline() for _ in range(8)]  # under way
            waiting = [pool.submit(post, url, "/v1/chat/completions", {**body, "stream": streamed}) for streamed in (False, True)]
            await_metrics(url, lambda text: metric(text, "queue_waiting") >= 2, "the requests never queued")
            process.send_signal(interrupt)
            events += stream.read().splitlines(keepends=True)
            answers = [request.result(timeout=30) for request in waiting]
        data = [line.decode().removeprefix("data: ").strip() for line in events if line.startswith(b"data: ")]
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["error"]["message"] == "the server is shutting down; the request was not completed"
        for status, error, _ in answers:
            assert (status, error["error"]["message"], error["error"]["code"]) == (
                503, "the server is shutting down; the request was not completed", "server_shutting_down")
        assert process.wait(timeout=20) == 0
        log = process.stderr.read()
        assert "Traceback" not in log and "graceful shutdown exceeded" not in log, log
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize(
    "args, complaint",
    [
        (["--spec", "oracle"], "--spec must be one of"),
        (["--k", "0"], "--k (draft tokens per step) must be between 1 and 64"),
        (["--queue", "-1"], "error: --queue must be at least 0 (0: none waits), got -1"),
        (["--parallel", "0"], "error: --parallel must be between 1 and 256 (llama.cpp's limit), got 0"),
        (["--parallel", "257"], "error: --parallel must be between 1 and 256 (llama.cpp's limit), got 257"),
        (["--parallel", "4", "--ctx", "4096"], "error: --ctx 4096 gives each of 4 slots 1024 tokens, more than the 512 tokens"),
        (["--host", ""], "error: --host is empty; give an address (0.0.0.0 listens on every interface)"),
        (["--threads", "513"], "error: --threads must be at most 512 (ggml's limit), got 513"),
    ],
)
def test_serve_refuses_bad_settings_in_one_line(chat_pair, args, complaint):
    result = CliRunner().invoke(cli_app, ["serve", "-m", str(chat_pair[0]), "-md", str(chat_pair[1]), *args])
    assert result.exit_code != 0
    assert complaint in result.stderr and "Traceback" not in result.stderr


def test_serve_refuses_a_port_in_use_in_one_line(chat_pair):
    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli_app, ["serve", "-m", str(chat_pair[0]), "-md", str(chat_pair[1]),
                                              "--port", str(port)])
    finally:
        taken.close()
    assert result.exit_code != 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_every_configurations_auto_starts_from_the_pairs_one_cost_profile(chat_pair, monkeypatch):
    """Three configurations asked with `auto`: the pair is profiled once (its widest verify, 25 rows,
    timed PROFILE_TIMINGS times), not once per configuration."""
    timed_widest = widest_verify_timings(monkeypatch, chat_pair[0])
    with serving(chat_pair) as url:
        c = client(url)
        ask(c, "hello there")  # K = 3: nothing profiled
        assert timed_widest == []
        for spec in ("model", "ngram", "ngram+model"):
            ask(c, "hello there", extra_body={"speculative": {"spec": spec, "k": "auto"}})
    assert timed_widest == [25] * PROFILE_TIMINGS


def test_the_pair_named_at_start_is_the_model_too(chat_pair):
    """`speccli serve qwen2.5-coder-1.5b` answered `model: "qwen2.5-coder-1.5b"` with a 404 (it serves
    the target's name): a client configured with the name from the command line failed."""
    with serving(chat_pair, aliases=("tiny-pair",)) as url:
        c = client(url)
        assert c.chat.completions.create(model="tiny-pair", messages=[{"role": "user", "content": "hi"}], max_tokens=2).model == MODEL
        assert c.models.retrieve("tiny-pair").id == MODEL and [m.id for m in c.models.list().data] == [MODEL]
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("tiny-pai")
