"""A request's body: read, refused past MAX_BODY_BYTES, and parsed into its schema, each fault an
OpenAI-shaped error naming the field (`speccli.server.api_errors`)."""
from __future__ import annotations

import json
import re
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from speccli.server.api_errors import APIError, ClientGone
from speccli.server.schemas import first_at, is_surrogate_text, misspelt_parameter, unsupported_parameter

MAX_BODY_BYTES = 16 * 2**20

RequestModel = TypeVar("RequestModel", bound=BaseModel)


async def parse_body(request: Request, schema: type[RequestModel]) -> RequestModel:
    """The body as `schema`, refused (400) where it is no JSON object, holds a lone surrogate, sets a
    parameter this server cannot honour, or fails the schema; the message names the field."""
    check_content_type(request)
    body = await read_body(request)
    try:
        payload = json.loads(body, parse_int=_whole_number)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(400, f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise APIError(400, "the request body is not valid JSON: nested too deeply") from None
    if not isinstance(payload, dict):
        raise APIError(400, "the request body must be a JSON object")
    if (where := first_at(payload, is_surrogate_text)) is not None:
        where = where.encode("utf-8", "backslashreplace").decode()  # a key may hold one too
        raise APIError(400, f"{where}: holds a lone UTF-16 surrogate escape (such as \\ud800), which is no "
                            "character; send text as UTF-8 or as paired escapes", param=where)
    if (where := first_at(payload, lambda value: value is _PAST_EVERY_LIMIT)) is not None:
        raise APIError(400, f"{where}: a whole number of over 4,300 digits, past every limit here", param=where)
    if unsupported := unsupported_parameter(payload):
        raise APIError(400, f"{unsupported}: not supported by this server; leave it out",
                       param=unsupported, code="unsupported_parameter")
    if misspelt := misspelt_parameter(payload, schema):
        raise APIError(400, f"{misspelt[0]}: not a field of this request; did you mean {misspelt[1]}?", param=misspelt[0])
    try:
        return schema.model_validate(payload)
    except ValidationError as error:
        # Of a union's alternatives, the one the body got furthest into says what is wrong
        # (content given as parts: the part's field, not "should be a valid string").
        first = max(error.errors(), key=lambda detail: len(detail["loc"]))
        where = _field_path(first["loc"])
        message = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own words
        raise APIError(400, f"{where}: {message}" if where else message, param=where or None) from None


def _whole_number(text: str) -> int | object:
    """Python converts no integer of over 4,300 digits (json.loads raised a ValueError naming no field:
    a 500). Such a number is past every limit here: it is marked, and refused naming its field."""
    try:
        return int(text)
    except ValueError:
        return _PAST_EVERY_LIMIT


_PAST_EVERY_LIMIT = object()


def check_content_type(request: Request) -> None:
    """Only a body sent as application/json is read (OpenAI's and llama-server's contract). A web page
    can post text/plain, a form or no type at all to any address without the browser asking first
    (no CORS preflight); read as JSON, such a post from a page the user visits could make a local
    server without a key generate, and with --remember write into the store (415)."""
    declared = request.headers.get("content-type")
    if declared is not None and declared.partition(";")[0].strip(" \t").lower() == "application/json":
        return
    said = f"Content-Type {declared!r} is not supported" if declared is not None else "the request has no Content-Type"
    raise APIError(415, f"{said}: send the body as application/json (curl: -H 'Content-Type: application/json')",
                   code="unsupported_media_type")


async def read_body(request: Request) -> bytes:
    """The request body, refused (413) past MAX_BODY_BYTES before it is all read: that much text is
    millions of tokens, past any context here, and reading and tokenizing it costs seconds (20 MB: 8 s)."""
    encoding = request.headers.get("content-encoding", "identity")
    if encoding.lower() != "identity":  # read as JSON, a gzip body had been "not valid JSON: 'utf-8' codec ..."
        raise APIError(415, f"Content-Encoding {encoding!r} is not supported: send the body uncompressed",
                       code="unsupported_content_encoding")
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


def _field_path(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as the request's own field path: "messages.0.content", without
    pydantic's names for union alternatives and constrained types ("str", "list[TextPart]",
    "constrained-int")."""
    return ".".join(str(part) for part in loc if isinstance(part, int) or not _TYPE_TAG.fullmatch(part))


_TYPE_TAG = re.compile(r"str|int|float|bool|.*[\[\]-].*|[A-Z][A-Za-z]*")  # the last: a model's class name
