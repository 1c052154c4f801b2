"""One generation's events -> an OpenAI chat or text completion, whole or as server-sent events, with
a `speculative` object beside `usage` (README: "Server")."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import AsyncIterator

from speccli.core.stats import DoneEvent, RunStats, TokenEvent, drafting_record
from speccli.core.text import begins_a_stop
from speccli.server.api_errors import ClientGone, api_error_for
from speccli.server.schemas import ChatCompletionRequest, GenerationRequest
from speccli.server.service import Service
from speccli.server.tools import call_id
from speccli.server.worker import GenerationError, Job, Speculation, Started

# OpenAI's finish reasons for the Generator's.
FINISH_REASONS = {"eog": "stop", "stop": "stop", "max_tokens": "length", "context": "length"}


async def next_items(job: Job, gone: asyncio.Future | None) -> list[object]:
    """The job's next events: at least one, and every other one already there (one write for all).

    With `gone` (the app's watch for a disconnect), a client that disconnects first raises ClientGone at once.
    (A streaming response is not watched here: Starlette cancels it on disconnect, and only one may read.)"""
    items = _drain(job)
    if items:
        return items
    if gone is None:
        return [await job.events.get(), *_drain(job)]
    getter = asyncio.ensure_future(job.events.get())
    try:
        await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return [getter.result(), *_drain(job)]
        job.cancelled.set()
        raise ClientGone
    finally:
        getter.cancel()


def _drain(job: Job) -> list[object]:
    items = []
    while not job.events.empty():
        items.append(job.events.get_nowait())
    return items


class Reply:
    """One generation's events -> an OpenAI chat or text completion, whole or as SSE chunks."""

    def __init__(self, service: Service, job: Job, body: GenerationRequest, speculation: Speculation, chat: bool) -> None:
        self.service, self.job, self.body, self.speculation, self.chat = service, job, body, speculation, chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.cached_tokens = 0
        tools = body.tool_request() if isinstance(body, ChatCompletionRequest) else None
        self.reads_calls = tools is not None and tools.calls  # whether the reply's text may hold tool calls
        self.only_calls = self.reads_calls and tools.choice != "auto"  # required, or a function named: no content
        self.answered_in_text = tools is None or tools.answer is None  # else JSON, under response_format
        self.loose_calls = service.loose_calls(tools)  # calls written as bare JSON, where they are read

    def _content_and_calls(self, text: str, reason: str) -> tuple[str | None, list[dict]]:
        """The reply's content and tool calls: a reply cut short (by max_tokens) is all content (a json
        reply's text answer: the answer so far)."""
        if not self.reads_calls:
            return text, []
        if FINISH_REASONS[reason] != "stop":
            answer = self.service.tool_style.answer_so_far(text) if self.answered_in_text else None
            return (text if answer is None else answer), []
        return self.service.tool_style.read(text, self.loose_calls, self.answered_in_text)

    def _trailing_text(self, done: DoneEvent) -> str:
        """The text held back at the end, less any part of the chat format's end-of-turn marker that a
        reply cut by max_tokens had begun ("Hi\\nUser" at the plain transcript's "\\nUser:"), as chat does."""
        marker = self.chat and begins_a_stop(done.trailing_text, self.service.chat_format.stop)
        return "" if marker else done.trailing_text

    async def collect(self, gone: asyncio.Future, items: list[object]) -> dict:
        pieces: list[str] = []
        while True:
            for item in items:
                if isinstance(item, Started):
                    self.cached_tokens = item.cached_tokens
                elif isinstance(item, TokenEvent):
                    pieces.append(item.text)
                elif isinstance(item, DoneEvent):
                    pieces.append(self._trailing_text(item))
                    text = "".join(pieces)
                    content, calls = self._content_and_calls(text, item.reason)
                    choice = {"index": 0, "finish_reason": "tool_calls" if calls else FINISH_REASONS[item.reason], "logprobs": None}
                    message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
                    choice.update({"message": message} if self.chat else {"text": text})
                    return {**self._envelope("chat.completion" if self.chat else "text_completion"),
                            "choices": [choice], **self._figures(item.stats)}
                elif isinstance(item, GenerationError):
                    raise api_error_for(item)
            items = await next_items(self.job, gone)

    async def stream(self, items: list[object]) -> AsyncIterator[str]:
        try:
            if self.chat:
                yield self._chunk({"role": "assistant", "content": None if self.only_calls else ""}, None)
            text, sent = "", 0  # with tool calls: the reply so far, and how much content went out
            calls_sent: list[int] = []  # each call streamed so far: how much of its arguments went out
            scanned: dict[int, tuple[int, int, bool]] = {}  # how far the calls' arguments were read (`calls_so_far`)
            decoded: dict[str, tuple[int, str]] = {}  # how far a json reply's answer was decoded (`answer_so_far`)
            while True:
                out: list[str] = []
                for item in items:
                    if isinstance(item, Started):
                        self.cached_tokens = item.cached_tokens
                    elif isinstance(item, TokenEvent) and item.text and self.reads_calls:
                        text += item.text
                        shown = self.service.tool_style.shown_so_far(text, self.loose_calls is not None, self.answered_in_text,
                                                                         decoded)
                        if len(shown) > sent:
                            out.append(self._chunk({"content": shown[sent:]}, None))
                            sent = len(shown)
                        out += self._call_deltas(self.service.tool_style.calls_so_far(text, scanned), calls_sent)
                    elif isinstance(item, TokenEvent) and item.text:
                        out.append(self._chunk({"content": item.text} if self.chat else item.text, None))
                    elif isinstance(item, DoneEvent):
                        finish = FINISH_REASONS[item.reason]
                        if self.reads_calls:
                            text += self._trailing_text(item)
                            content, calls = self._content_and_calls(text, item.reason)
                            if finish != "stop":  # cut short: a call begun went out as far as it went, its text not as content
                                content = self.service.tool_style.shown_so_far(text, False, self.answered_in_text)
                            if content and content[sent:]:
                                out.append(self._chunk({"content": content[sent:]}, None))
                            if calls:
                                finish = "tool_calls"
                                begun = self._call_deltas(self.service.tool_style.calls_so_far(text, scanned)[:len(calls_sent)], calls_sent)
                                rest = [{"index": i, **call} for i, call in enumerate(calls) if i >= len(calls_sent)]
                                out += [*begun, *([self._chunk({"tool_calls": rest}, None)] if rest else [])]
                        elif trailing := self._trailing_text(item):
                            out.append(self._chunk({"content": trailing} if self.chat else trailing, None))
                        # With include_usage the usage comes once, on a last chunk of its own (as OpenAI
                        # sends it): clients that add up every chunk's usage would count it twice.
                        usage_apart = self.body.stream_options is not None and self.body.stream_options.include_usage
                        out.append(self._chunk({} if self.chat else "", finish, item.stats, usage=not usage_apart))
                        if usage_apart:
                            out.append(self._usage_chunk(item.stats))
                        out.append("data: [DONE]\n\n")
                        yield "".join(out)
                        return
                    elif isinstance(item, GenerationError):
                        error = api_error_for(item).response().body.decode()
                        yield "".join(out) + f"data: {error}\n\ndata: [DONE]\n\n"
                        return
                if out:
                    yield "".join(out)
                items = await next_items(self.job, None)
        finally:
            self.service.worker.cancel(self.job)  # the client left (or the reply is done, when it changes nothing)

    def _call_deltas(self, calls: list[tuple[str, str]], calls_sent: list[int]) -> list[str]:
        """Chunks for what `calls` (the reply's calls so far) add to what went out: a new call's id and
        name with its arguments so far, then each call's arguments as they grow (OpenAI's deltas)."""
        chunks = []
        for index, (name, arguments) in enumerate(calls):
            if index == len(calls_sent):
                delta = {"index": index, "id": call_id(), "type": "function",
                         "function": {"name": name, "arguments": arguments}}
                calls_sent.append(0)
            elif len(arguments) > calls_sent[index]:
                delta = {"index": index, "function": {"arguments": arguments[calls_sent[index]:]}}
            else:
                continue
            calls_sent[index] = len(arguments)
            chunks.append(self._chunk({"tool_calls": [delta]}, None))
        return chunks

    def _envelope(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.service.model_id}

    def _chunk(self, delta: dict | str, finish_reason: str | None, stats: RunStats | None = None, usage: bool = True) -> str:
        choice: dict = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        choice.update({"delta": delta} if self.chat else {"text": delta})
        return self._event([choice], stats, usage)

    def _usage_chunk(self, stats: RunStats) -> str:
        """OpenAI's last chunk with `stream_options.include_usage`: no choices, the usage (here with
        the statistics, which the finish chunk before it carries too)."""
        return self._event([], stats)

    def _event(self, choices: list[dict], stats: RunStats | None, usage: bool = True) -> str:
        chunk = {**self._envelope("chat.completion.chunk" if self.chat else "text_completion"), "choices": choices}
        if stats is not None:
            chunk.update(self._figures(stats))
            if not usage:
                del chunk["usage"]
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    def _figures(self, stats: RunStats) -> dict:
        usage = {
            "prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated,
            "total_tokens": stats.prompt_tokens + stats.generated,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        return {"usage": usage, "speculative": speculative_summary(stats, self.speculation)}


def speculative_summary(stats: RunStats, speculation: Speculation) -> dict:
    """The per-response `speculative` object (README: "Server")."""
    return {
        "enabled": speculation.spec is not None,
        "spec": speculation.spec,
        "k": speculation.k,
        **drafting_record(stats),
        "decode_tokens_per_second": round(stats.tokens_per_second, 2),
    }
