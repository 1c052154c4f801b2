"""The OpenAI-compatible HTTP app: routes, exception handlers and the API-key middleware.

It stays thin: a request becomes a token prompt (chat messages through the target's chat template,
or a raw prompt), generation limits, sampling settings and a drafting configuration (`service`),
handed to the one generation thread (`worker`); the events that come back become OpenAI-shaped
responses (`reply`). Every error is OpenAI-shaped JSON (`api_errors`), never a traceback.
"""
from __future__ import annotations

import asyncio
import hmac
import time
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Callable, Iterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from speccli.core.sampling import SamplingParams
from speccli.errors import SpeccliError
from speccli.server.api_errors import (
    SHUTTING_DOWN_CODE, UNAVAILABLE_CODE, APIError, ClientGone, api_error_for, shutting_down_error, unavailable_error,
)
from speccli.server.metrics import Metrics
from speccli.server.reply import Reply, next_items
from speccli.server.request_body import parse_body
from speccli.server.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest
from speccli.server.service import Service
from speccli.server.worker import GenerationError, Job, LostError, QueueFullError, ShuttingDownError


def create_app(service: Service) -> Starlette:
    card = {"id": service.model_id, "object": "model", "created": service.created, "owned_by": "speccli"}

    def _unknown_model(name: str) -> APIError:
        return APIError(404, f"the model {name!r} does not exist; this server serves {service.model_id!r}",
                        param="model", code="model_not_found")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [card]})

    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        if not name or name.endswith("/"):  # a trailing slash, as on any other path
            raise HTTPException(404)
        if not service.serves(name):
            raise _unknown_model(name)
        return JSONResponse(card)

    async def health(_: Request) -> Response:
        if service.worker.lost is not None:
            return JSONResponse({"status": "error", "model": service.model_id, "reason": service.worker.lost},
                                status_code=503)
        return JSONResponse({"status": "ok", "model": service.model_id})

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        if (i := body.unanswered_tool_result()) is not None:
            raise APIError(400, f"messages.{i}.tool_call_id: {body.messages[i].tool_call_id!r} answers no call of "
                                "the assistant's message before it", param=f"messages.{i}.tool_call_id")
        messages, tools = [message.as_template_message() for message in body.messages], body.tool_request()
        return await _generate(request, body, lambda: service.chat_prompt(messages, tools), chat=True)

    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        return await _generate(request, body, lambda: service.text_prompt(body.prompt), chat=False)

    async def _generate(request: Request, body: GenerationRequest, tokenize: Callable[[], list[int]], *, chat: bool) -> Response:
        arrived = time.perf_counter()  # queue wait and time to first token count tokenizing and the grammar too
        if not service.serves(body.model):
            raise _unknown_model(body.model)
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options: only allowed with stream: true", param="stream_options")
        speculation = service.speculation_for(body.speculative)
        grammar_spec = service.grammar_spec_for(body)
        sampling = SamplingParams(body.temperature, body.top_k, body.top_p, body.min_p)
        try:
            sampling.validate()
        except SpeccliError as error:
            raise APIError(400, str(error)) from None
        with _worker_refusals():
            service.worker.admit()
        try:
            try:
                prompt = await asyncio.to_thread(tokenize)  # a long prompt must not stall other requests
            except SpeccliError as error:
                raise APIError(400, str(error)) from None
            grammar = await asyncio.to_thread(service.grammar_for, grammar_spec)
            limits = service.limits_for(prompt, body, service.chat_format.stop if chat else (), grammar)
        except BaseException:
            service.worker.withdraw()
            raise
        job = Job(prompt, limits, sampling, body.seed, speculation, asyncio.get_running_loop(), arrived=arrived)
        with _worker_refusals():
            service.worker.submit(job)
        reply = Reply(service, job, body, speculation, chat)
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            started = await next_items(job, gone)
            if isinstance(started[0], GenerationError):  # it never ran (the server stopped as it waited)
                raise api_error_for(started[0])
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

    async def api_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, APIError)
        if error.code in (SHUTTING_DOWN_CODE, UNAVAILABLE_CODE):
            pass  # counted by the worker (cancelled, error): each request once, run, waiting or refused
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
        if error.status_code < 500:
            service.metrics.record(None, "rejected")
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
        headers = [value for name, value in scope["headers"] if name == b"authorization"]
        given = None
        if len(headers) == 1:  # of two, neither is taken: which one counts would be a guess
            scheme, _, token = headers[0].strip().partition(b" ")
            given = token.strip() if scheme.lower() == b"bearer" else None
        if given is not None and hmac.compare_digest(given, self.key):
            return None
        message = ("more than one Authorization header" if len(headers) > 1 else "incorrect API key provided" if given else
                   "no API key provided: send it in an Authorization header, as 'Authorization: Bearer KEY'")
        return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


@contextmanager
def _worker_refusals() -> Iterator[None]:
    """The worker's refusals of a request, as the API errors that answer them."""
    try:
        yield
    except QueueFullError:
        raise APIError(503, "the server is busy: its queue (--queue) is full; retry shortly",
                       kind="server_error", code="queue_full", headers={"Retry-After": "1"}) from None
    except ShuttingDownError:
        raise shutting_down_error() from None
    except LostError as lost:
        raise unavailable_error(str(lost)) from None


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects: after the body, the next ASGI message can only be that."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
