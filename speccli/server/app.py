"""The OpenAI-compatible HTTP layer: routes, request checks, JSON and server-sent-event responses.

It stays thin: a request becomes a token prompt (chat messages through the target's chat template,
or a raw prompt), generation limits, sampling settings and a drafting configuration, handed to the
one generation thread (`speccli.server.worker`); the events that come back become OpenAI-shaped
responses with a `speculative` object beside `usage`. Every error is OpenAI-shaped JSON
(`{"error": {"message", "type", "param", "code"}}`), never a traceback.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import re
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Sequence, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from speccli.chat.template import ChatFormat, chat_format_for, tokenize_rendered
from speccli.core.generator import GenerationLimits
from speccli.core.sampling import SamplingParams
from speccli.core.stats import DoneEvent, RunStats, TokenEvent, drafting_record
from speccli.core.text import begins_a_stop
from speccli.errors import SpeccliError
from speccli.llama.model import Model, shared_context
from speccli.server.metrics import Metrics
from speccli.server.schemas import (
    ChatCompletionRequest, CompletionRequest, GenerationRequest, SpeculationControl, unsupported_parameter,
)
from speccli.server.worker import (
    SHUTTING_DOWN, GenerationError, Job, QueueFullError, ShuttingDownError, Speculation, Started, Worker,
)
from speccli.validation import needs_draft_model

# OpenAI's finish reasons for the Generator's.
FINISH_REASONS = {"eog": "stop", "stop": "stop", "max_tokens": "length", "context": "length"}
MAX_BODY_BYTES = 16 * 2**20

RequestModel = TypeVar("RequestModel", bound=BaseModel)


class APIError(Exception):
    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code, self.headers = status, message, kind, param, code, headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class ClientGone(Exception):
    """The client closed the connection while its request waited or ran."""


@dataclass
class Service:
    """What the routes serve: the loaded models, the default drafting configuration, the worker."""

    model_id: str
    target: Model
    draft: Model | None
    default_speculation: Speculation
    worker: Worker
    metrics: Metrics
    api_key: str | None = None  # what `Authorization: Bearer` must carry on every path but /health; None: open

    def __post_init__(self) -> None:
        self.chat_format: ChatFormat = chat_format_for(self.target.tokenizer)[0]
        self.created = int(time.time())

    @property
    def n_ctx(self) -> int:
        return shared_context(self.target, self.draft)

    def speculation_for(self, control: SpeculationControl | None) -> Speculation:
        if control is None:
            return self.default_speculation
        if not control.enabled:
            return Speculation(None, None)
        spec = control.spec or self.default_speculation.spec or ("model" if self.draft is not None else "ngram")
        if needs_draft_model(spec) and self.draft is None:
            raise APIError(400, f"speculative.spec {spec!r} needs a draft model, and this server has none "
                           "(start it with a draft, or use 'ngram')", param="speculative.spec")
        k = self.default_speculation.k if control.k is None else control.k
        return Speculation(spec, k)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Tokens for the messages as the target's template renders them, as `speccli chat` tokenizes
        a conversation's first turn (so the same message gives the same reply)."""
        return tokenize_rendered(self.target.tokenizer, self.chat_format, self.chat_format.render(messages))

    def text_prompt(self, prompt: str | list[int]) -> list[int]:
        """Text as the tokenizer reads it (BOS first where the model wants one); token ids as given."""
        if isinstance(prompt, str):
            return self.target.tokenizer.tokenize(prompt, True, True)
        n_vocab = self.target.n_vocab
        if max(prompt) >= n_vocab:
            raise APIError(400, f"prompt: token id {max(prompt)} is past this model's vocabulary of {n_vocab}",
                           param="prompt")
        return prompt

    def limits_for(self, prompt: Sequence[int], body: GenerationRequest, stop: tuple[str, ...]) -> GenerationLimits:
        """Refuses a prompt, or prompt plus max_tokens, that the context cannot hold (as OpenAI does);
        without max_tokens a reply may fill the context."""
        room = self.n_ctx - len(prompt)
        requested = body.token_limit()
        if room < 1 or (requested is not None and requested > room):
            asked = f" plus {requested} max_tokens" if requested is not None else ""
            raise APIError(
                400, f"this model's context holds {self.n_ctx} tokens; the prompt has {len(prompt)}{asked}",
                param="messages" if isinstance(body, ChatCompletionRequest) else "prompt", code="context_length_exceeded",
            )
        return GenerationLimits(requested if requested is not None else room, stop + body.stop_strings())


def create_app(service: Service) -> Starlette:
    card = {"id": service.model_id, "object": "model", "created": service.created, "owned_by": "speccli"}

    def _unknown_model(name: str) -> APIError:
        return APIError(404, f"the model {name!r} does not exist; this server serves {service.model_id!r}",
                        param="model", code="model_not_found")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [card]})

    async def model(request: Request) -> Response:
        if not request.path_params["model"]:  # /v1/models/: a trailing slash, as on any other path
            raise HTTPException(404)
        if request.path_params["model"] != service.model_id:
            raise _unknown_model(request.path_params["model"])
        return JSONResponse(card)

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok", "model": service.model_id})

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        messages = [message.as_template_message() for message in body.messages]
        return await _generate(request, body, lambda: service.chat_prompt(messages), chat=True)

    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        return await _generate(request, body, lambda: service.text_prompt(body.prompt), chat=False)

    async def _generate(request: Request, body: GenerationRequest, tokenize: Callable[[], list[int]], *, chat: bool) -> Response:
        if body.model != service.model_id:
            raise _unknown_model(body.model)
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options: only allowed with stream: true", param="stream_options")
        speculation = service.speculation_for(body.speculative)
        sampling = SamplingParams(body.temperature, body.top_k, body.top_p, body.min_p)
        try:
            sampling.validate()
            prompt = await asyncio.to_thread(tokenize)  # a long prompt must not stall other requests
        except SpeccliError as error:
            raise APIError(400, str(error)) from None
        limits = service.limits_for(prompt, body, service.chat_format.stop if chat else ())
        job = Job(prompt, limits, sampling, body.seed, speculation, asyncio.get_running_loop())
        try:
            service.worker.submit(job)
        except QueueFullError:
            raise APIError(503, "the server is busy: a request runs and its queue (--queue) is full; retry shortly",
                           kind="server_error", code="queue_full", headers={"Retry-After": "1"}) from None
        except ShuttingDownError:
            raise _shutting_down() from None
        reply = Reply(service, job, body, speculation, chat)
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            started = await _next_items(job, gone)
            if isinstance(started[0], GenerationError):  # it never ran (the server stopped as it waited)
                raise _api_error(started[0])
            if not body.stream:
                return JSONResponse(await reply.collect(gone, started))
        except ClientGone:
            service.worker.cancel(job)  # cancelled already: this frees its place if it was still waiting
            return Response(status_code=499)  # nobody reads it; the generation was cancelled
        except BaseException:
            service.worker.cancel(job)
            raise
        finally:
            gone.cancel()  # a stream is watched by Starlette from here on
        return StreamingResponse(reply.stream(started), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _parse(request: Request, schema: type[RequestModel]) -> RequestModel:
        body = await _body(request)
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise APIError(400, f"the request body is not valid JSON: {error}") from None
        except RecursionError:
            raise APIError(400, "the request body is not valid JSON: nested too deeply") from None
        if not isinstance(payload, dict):
            raise APIError(400, "the request body must be a JSON object")
        if (where := _lone_surrogate_at(payload)) is not None:
            where = where.encode("utf-8", "backslashreplace").decode()  # a key may hold one too
            raise APIError(400, f"{where}: holds a lone UTF-16 surrogate escape (such as \\ud800), which is no "
                                "character; send text as UTF-8 or as paired escapes", param=where)
        if unsupported := unsupported_parameter(payload):
            raise APIError(400, f"{unsupported}: not supported by this server; leave it out",
                           param=unsupported, code="unsupported_parameter")
        try:
            return schema.model_validate(payload)
        except ValidationError as error:
            # Of a union's alternatives, the one the body got furthest into says what is wrong
            # (content given as parts: the part's field, not "should be a valid string").
            first = max(error.errors(), key=lambda detail: len(detail["loc"]))
            where = _field_path(first["loc"])
            message = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own words
            raise APIError(400, f"{where}: {message}" if where else message, param=where or None) from None

    async def api_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, APIError)
        if error.code == SHUTTING_DOWN_CODE:
            pass  # counted by the worker, as cancelled: each request once, run, waiting or refused
        elif error.status == 503:
            service.metrics.record(None, "queue_full")
        elif error.status < 500:  # a generation that failed (500) was counted by the worker, as "error"
            service.metrics.record(None, "rejected")
        return error.response()

    async def http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        headers = dict(error.headers or {})
        if "Allow" in headers:  # a 405's, from a set of methods: its order varies from run to run
            headers["Allow"] = ", ".join(sorted(headers["Allow"].split(", ")))
        allowed = headers.get("Allow", "")
        if error.status_code == 404:  # OpenAI's code for a path it does not serve
            message, code = f"no such path: {request.method} {request.url.path}", "unknown_url"
        elif error.status_code == 405:
            message, code = f"{request.method} {request.url.path}: not allowed; use {allowed}", None
        else:
            message, code = str(error.detail), None
        return APIError(error.status_code, message, param=None, code=code, headers=headers).response()

    async def client_gone(_: Request, error: Exception) -> Response:
        """A client that left before its request was read (its body cut short): cancelled, as one that leaves
        while its generation waits or runs."""
        service.metrics.record(None, "cancelled")
        return Response(status_code=499)  # nobody reads it

    async def unexpected(_: Request, error: Exception) -> Response:
        service.metrics.record(None, "error")  # a bug: Starlette then logs its traceback
        return APIError(500, f"internal error: {type(error).__name__}", kind="server_error").response()

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    handlers = {APIError: api_error, HTTPException: http_error, ClientGone: client_gone, Exception: unexpected}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        service.worker.start()
        yield
        await asyncio.to_thread(service.worker.stop)

    middleware = [] if service.api_key is None else [Middleware(RequireKey, key=service.api_key, metrics=service.metrics)]
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan, middleware=middleware)
    # A path with a trailing slash is an unknown path (404, JSON), not a redirect built from the
    # client's own Host header.
    app.router.redirect_slashes = False
    return app


class RequireKey:
    """ASGI middleware: a request to any path but /health (a load balancer's probe) without
    `Authorization: Bearer KEY` gets OpenAI's 401 (`invalid_api_key`), counted as rejected, before any
    route reads it. The key is compared in constant time, so its timing tells nothing of it."""

    def __init__(self, app: ASGIApp, key: str, metrics: Metrics) -> None:
        self.app, self.key, self.metrics = app, key.encode(), metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and (refusal := self._refusal(scope)) is not None:
            self.metrics.record(None, "rejected")
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> APIError | None:
        given = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.strip().partition(b" ")
                given = token.strip() if scheme.lower() == b"bearer" else None
        if given is not None and hmac.compare_digest(given, self.key):
            return None
        message = ("incorrect API key provided" if given else
                   "no API key provided: send it in an Authorization header, as 'Authorization: Bearer KEY'")
        return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def _body(request: Request) -> bytes:
    """The request body, refused (413) past MAX_BODY_BYTES before it is all read: that much text is
    millions of tokens, past any context here, and reading and tokenizing it costs seconds (20 MB: 8 s)."""
    too_large = APIError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:  # closed before the whole body came: nobody to answer
        raise ClientGone from None
    return b"".join(chunks)


SHUTTING_DOWN_CODE = "server_shutting_down"


def _shutting_down() -> APIError:
    return APIError(503, SHUTTING_DOWN, kind="server_error", code=SHUTTING_DOWN_CODE)


def _api_error(error: GenerationError) -> APIError:
    """A failed generation as the client hears it, whole or as a stream's last event."""
    return _shutting_down() if error.status == 503 else APIError(error.status, str(error), kind="server_error")


def _lone_surrogate_at(value: object, path: str = "") -> str | None:
    """The field path of the first string in a parsed body that holds a lone surrogate (JSON's "\\ud800"
    parses to one; it cannot be encoded as UTF-8 for the tokenizer), None if there is none."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if (found := _lone_surrogate_at(item, f"{path}.{key}" if path else str(key))) is not None:
            return found
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _field_path(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as the request's own field path: "messages.0.content", without
    pydantic's names for union alternatives and constrained types ("str", "list[TextPart]",
    "constrained-int")."""
    return ".".join(str(part) for part in loc if isinstance(part, int) or not _TYPE_TAG.fullmatch(part))


_TYPE_TAG = re.compile(r"str|int|float|bool|.*[\[\]-].*")


async def _next_items(job: Job, gone: asyncio.Future | None) -> list[object]:
    """The job's next events: at least one, and every other one already there (one write for all).

    With `gone` (see `_client_gone`), a client that disconnects first raises ClientGone at once.
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


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects: after the body, the next ASGI message can only be that."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
                    choice = {"index": 0, "finish_reason": FINISH_REASONS[item.reason], "logprobs": None}
                    text = "".join(pieces)
                    choice.update({"message": {"role": "assistant", "content": text}} if self.chat else {"text": text})
                    return {**self._envelope("chat.completion" if self.chat else "text_completion"),
                            "choices": [choice], **self._figures(item.stats)}
                elif isinstance(item, GenerationError):
                    raise _api_error(item)
            items = await _next_items(self.job, gone)

    async def stream(self, items: list[object]) -> AsyncIterator[str]:
        try:
            if self.chat:
                yield self._chunk({"role": "assistant", "content": ""}, None)
            while True:
                out: list[str] = []
                for item in items:
                    if isinstance(item, Started):
                        self.cached_tokens = item.cached_tokens
                    elif isinstance(item, TokenEvent) and item.text:
                        out.append(self._chunk({"content": item.text} if self.chat else item.text, None))
                    elif isinstance(item, DoneEvent):
                        if trailing := self._trailing_text(item):
                            out.append(self._chunk({"content": trailing} if self.chat else trailing, None))
                        out.append(self._chunk({} if self.chat else "", FINISH_REASONS[item.reason], item.stats))
                        if self.body.stream_options is not None and self.body.stream_options.include_usage:
                            out.append(self._usage_chunk(item.stats))
                        out.append("data: [DONE]\n\n")
                        yield "".join(out)
                        return
                    elif isinstance(item, GenerationError):
                        error = _api_error(item).response().body.decode()
                        yield "".join(out) + f"data: {error}\n\ndata: [DONE]\n\n"
                        return
                if out:
                    yield "".join(out)
                items = await _next_items(self.job, None)
        finally:
            self.service.worker.cancel(self.job)  # the client left (or the reply is done, when it changes nothing)

    def _envelope(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.service.model_id}

    def _chunk(self, delta: dict | str, finish_reason: str | None, stats: RunStats | None = None) -> str:
        choice: dict = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        choice.update({"delta": delta} if self.chat else {"text": delta})
        return self._event([choice], stats)

    def _usage_chunk(self, stats: RunStats) -> str:
        """OpenAI's last chunk with `stream_options.include_usage`: no choices, the usage (here with
        the statistics, as on the chunk before, which also carries them so that any client finds them)."""
        return self._event([], stats)

    def _event(self, choices: list[dict], stats: RunStats | None) -> str:
        chunk = {**self._envelope("chat.completion.chunk" if self.chat else "text_completion"), "choices": choices}
        if stats is not None:
            chunk.update(self._figures(stats))
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
