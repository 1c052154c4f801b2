"""Tool calls (OpenAI's `tools` and `tool_choice`): how a request's tools reach the prompt, the grammar
that a reply which may or must call one follows, and the calls read back out of the reply's text.

How a model writes a call depends on what it was trained on, which its chat template shows:
- `hermes` (Qwen 2.5, Hermes, and every template that writes `<tool_call>`): the template renders the
  tools itself, and a call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- `json`, for every other template (llama.cpp's "generic" format): the tools are described in a system
  message, and the whole reply is one JSON object, `{"tool_call": {...}}` or `{"response": "..."}`.

The grammar is the reply's constraint like any other (docs/exactness.md#structured-output): under
`auto` a hermes reply's text stays free and only a call's JSON is held to its function's parameters.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from speccli.core.constraint import JSON_LAYOUT, GrammarSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools (OpenAI's function definitions: name, description, parameters) and its choice:
    "none", "auto", "required", or the one function's name that must be called."""

    functions: tuple[dict[str, Any], ...]
    choice: str
    parallel: bool
    answer: dict[str, Any] | None = None  # the JSON schema a reply that calls nothing follows (response_format)

    @property
    def calls(self) -> bool:
        """Whether the reply may call a tool at all."""
        return bool(self.functions) and self.choice != "none"

    def callable(self) -> list[dict[str, Any]]:
        named = self.choice not in ("auto", "required")
        return [f for f in self.functions if f["name"] == self.choice] if named else list(self.functions)


@dataclass(frozen=True)
class ToolStyle:
    """The way the target writes calls: `hermes` or `json` (above). `special_markers`: the grammar names
    <tool_call> and </tool_call> as the vocabulary's special tokens (else as text)."""

    name: str
    special_markers: bool = False

    def prompt_messages(self, messages: Sequence[dict[str, Any]], tools: ToolRequest | None) -> list[dict[str, Any]]:
        """The conversation as the template takes it: a hermes template reads tool calls and results
        itself; otherwise they are written as the JSON replies this style asks for, and the tools that may
        be called go into the system message."""
        if self.name == "hermes":
            return list(messages)
        rendered: list[dict[str, Any]] = []
        for message in messages:
            if message.get("tool_calls"):
                calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
                content = json.dumps({"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}, ensure_ascii=False)
                message = {"role": "assistant", "content": content}
            elif message["role"] == "tool":
                result = {"tool_call_id": message.get("tool_call_id"), "content": message["content"]}
                message = {"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)}
            if rendered and rendered[-1]["role"] == message["role"] != "system":  # templates that insist on turns
                rendered[-1] = {**rendered[-1], "content": f"{rendered[-1]['content']}\n\n{message['content']}"}
            else:
                rendered.append(dict(message))
        if tools is not None and tools.calls:
            described = self._described(tools)
            if rendered and rendered[0]["role"] == "system":
                rendered[0] = {**rendered[0], "content": f"{rendered[0]['content']}\n\n{described}"}
            else:
                rendered.insert(0, {"role": "system", "content": described})
        return rendered

    def template_tools(self, tools: ToolRequest | None) -> list[dict[str, Any]] | None:
        """What a hermes template gets as `tools` (OpenAI's form): none where none may be called."""
        if self.name != "hermes" or tools is None or not tools.calls:
            return None
        return [{"type": "function", "function": function} for function in tools.functions]

    def _described(self, tools: ToolRequest) -> str:
        listed = "\n".join(json.dumps(function, ensure_ascii=False) for function in tools.functions)
        how = ('To call a tool, reply with one JSON object: {"tool_call": {"name": <tool name>, "arguments": {...}}}'
               + (', or {"tool_calls": [...]} for several' if tools.parallel else ""))
        if tools.choice == "auto":
            answer = "<your answer>" if tools.answer is None else f"<your answer: JSON following {json.dumps(tools.answer)}>"
            how += f'; to answer directly, reply {{"response": {answer}}}'
        return f"You can call these tools:\n{listed}\n\n{how}."

    def grammar(self, tools: ToolRequest) -> GrammarSpec | None:
        """What a reply must follow when it may call a tool (None when it may not)."""
        if not tools.calls:
            return None
        calls = [_call_schema(function, i) for i, function in enumerate(tools.callable())]
        # response_format's schema, where given, as a definition beside the calls' (its references re-pointed)
        definitions = {k: v for _, d in calls for k, v in d.items()}
        if tools.answer is not None:
            own = {key: value for key, value in tools.answer.items() if key != "x-guidance"}
            definitions["answer"] = _rebased(own, "#/$defs/answer")
        if self.name == "json":
            one = calls[0][0] if len(calls) == 1 else {"anyOf": [call for call, _ in calls]}
            called = _object({"tool_call": one})
            if tools.parallel:
                called = {"anyOf": [called, _object({"tool_calls": {"type": "array", "items": one, "minItems": 1}})]}
            if tools.choice == "auto":
                answer = {"type": "string"} if tools.answer is None else {"$ref": "#/$defs/answer"}
                called = {"anyOf": [called, _object({"response": answer})]}
            return GrammarSpec.json_schema({**called, "$defs": definitions}, "tools")
        open_, close = (OPEN, CLOSE) if self.special_markers else (json.dumps(OPEN), json.dumps(CLOSE))
        # The template ends a turn right after </tool_call>; the model may write a newline first. Under
        # `auto` a reply that calls nothing is free text, or where response_format asks for JSON, that JSON
        # (then no text leads into a call: free text beside the JSON is more than llguidance parses).
        start = 'calls "\\n"?'
        if tools.choice == "auto":
            start = f"answer | {start}" if tools.answer is not None else f"TEXT | TEXT? {start}"
        lines = [f"start: {start}",
                 "calls: call" + (' ("\\n" call)*' if tools.parallel else ""),
                 "call: " + " | ".join(f"call{i}" for i in range(len(calls))),
                 "TEXT: /(?s:.+)/"]
        if tools.answer is not None:
            # The answer's JSON, or a call written as bare JSON (`loose_call`: Qwen 2.5 Coder writes its
            # calls so, which the answer's schema alone would have bent into an answer), laid out as the
            # reply's JSON is alone unless the schema says how.
            schema = {"anyOf": [{"$ref": "#/$defs/answer"}, *(call for call, _ in calls)], "$defs": definitions,
                      "x-guidance": tools.answer.get("x-guidance", JSON_LAYOUT)}
            lines.append(f"answer: %json {json.dumps(schema)}")
        for i, (call, its_definitions) in enumerate(calls):
            call = {**call, "$defs": its_definitions, "x-guidance": JSON_LAYOUT}
            lines.append(f'call{i}: {open_} "\\n" %json {json.dumps(call)} "\\n" {close}')
        return GrammarSpec("grammar", "\n".join(lines) + "\n", "tools")

    def call_grammar(self, function: dict[str, Any]) -> GrammarSpec:
        """One call of `function` as JSON, as a call's JSON inside <tool_call> follows it."""
        schema, definitions = _call_schema(function, 0)
        return GrammarSpec.json_schema({**schema, "$defs": definitions, "x-guidance": JSON_LAYOUT}, "tools")

    def read(self, text: str, offered: Callable[[dict[str, Any]], bool] | None = None,
             answered_in_text: bool = True) -> tuple[str | None, list[dict[str, Any]]]:
        """The reply's content and its calls (OpenAI's `tool_calls`). A text that holds no whole call (one
        cut by max_tokens) is all content. `offered` (a hermes reply under `auto`): whether a call written
        as the whole reply's JSON (`loose_call`) is one the request offers, with arguments its tool takes."""
        try:
            if self.name == "json":
                reply = json.loads(text)
                if "response" in reply:  # text; or, under response_format, JSON: as its text
                    response = reply["response"]
                    return (response if answered_in_text else json.dumps(response, ensure_ascii=False)), []
                return None, [_call(c) for c in (reply["tool_calls"] if "tool_calls" in reply else [reply["tool_call"]])]
            before, marker, _ = text.partition(OPEN)
            if not marker:
                call = loose_call(text) if offered is not None else None
                return (None, [_call(call)]) if call is not None and offered(call) else (text, [])
            # Each call's JSON read whole, so that a marker inside an argument's string is the string's.
            calls, at = [], len(before)
            while at >= 0:
                body, end = _DECODER.raw_decode(text, _SPACE.match(text, at + len(OPEN)).end())
                closed = _SPACE.match(text, end).end()
                if not text.startswith(CLOSE, closed):
                    return text, []
                calls.append(_call(body))
                at = text.find(OPEN, closed + len(CLOSE))
            return before.rstrip() or None, calls
        except (ValueError, KeyError, TypeError):
            return text, []

    def shown_so_far(self, text: str, loose: bool = False, answered_in_text: bool = True,
                     decoded: dict[str, tuple[int, str]] | None = None) -> str:
        """The content a reply's text can stream before it ends: a hermes reply's text up to where a call
        may begin (whitespace held back: it may lead into one), none while it may be a `loose_call` where
        those are read; a json reply's answer as far as it is written, where it is text (`decoded`: see
        `answer_so_far`)."""
        if self.name == "json":
            return (self.answer_so_far(text, decoded) or "") if answered_in_text else ""
        if loose and _may_become_loose_call(text):
            return ""
        before = text.partition(OPEN)[0]
        for cut in range(min(len(OPEN) - 1, len(before)), 0, -1):  # a marker begun at the end
            if OPEN.startswith(before[-cut:]):
                before = before[:-cut]
                break
        return before.rstrip()

    def answer_so_far(self, text: str, decoded: dict[str, tuple[int, str]] | None = None) -> str | None:
        """A json reply's text answer, `{"response": "..."}`, decoded as far as it is written (an escape
        begun at the end, or half a surrogate pair, left out); None where the reply is not one (a call, or
        not yet either). `decoded`: kept between calls on a growing text, so that each decodes only what
        was added (a streamed answer of 20 KB would cost seconds of the event loop otherwise)."""
        at, answer = (decoded or {}).get("answer", (-1, ""))
        if at < 0:
            head = _TEXT_ANSWER.match(text) if self.name == "json" else None
            if head is None:
                return None
            at = head.end()
        raw = _ANSWER_CHARS.match(text, at)[0]
        part = json.loads(f'"{raw}"')
        if part and "\ud800" <= part[-1] <= "\udbff":  # half a surrogate pair: kept for its other half
            raw, part = (raw[:-1] if raw[-1] == part[-1] else raw[:-6]), part[:-1]
        at, answer = at + len(raw), answer + part
        if decoded is not None:
            decoded["answer"] = (at, answer)
        return answer

    def calls_so_far(self, text: str, scanned: dict[int, tuple[int, int, bool]] | None = None) -> list[tuple[str, str]]:
        """The calls a reply has begun, as far as it has written them, for streaming: each one's name (once
        whole) and the JSON text of its arguments so far, up to their closing brace where written. A call
        inside <tool_call> (hermes), or the json style's `tool_call`/`tool_calls`; not a `loose_call`,
        which is one only once the reply ends. Arguments cut short never close, so never parse.
        `scanned`: kept between calls on a growing text, so that each reads only what was added."""
        calls: list[tuple[str, str]] = []
        if self.name == "json":
            lead = _JSON_CALLS.match(text)
            at = lead.end() if lead else -1
        else:
            at = _after(text, OPEN, 0)
        while at >= 0 and (head := _CALL_HEAD.match(text, at)):
            end = _json_end(text, head.end(), {} if scanned is None else scanned)
            calls.append((json.loads(head[1]), text[head.end():end]))
            if end is None:
                break
            if self.name == "json":
                following = _NEXT_CALL.match(text, end)
                at = following.end() if following else -1
            else:
                at = _after(text, OPEN, end)
        return calls


# A whole reply that is one JSON object, bare or in a markdown block.
_LOOSE_CALL = re.compile(r"\s*(?:```(?:json)?\s*(\{.*\})\s*```|(\{.*\}))\s*", re.S)


def loose_call(text: str) -> dict[str, Any] | None:
    """A call written as the whole reply's JSON, bare or in a markdown block, not inside <tool_call>:
    `{"name": ..., "arguments": {...}}`. Qwen 2.5 Coder writes its calls so under `auto`, where the grammar
    leaves the text free; llama.cpp's Hermes parser reads them as calls too. None where it is not one."""
    match = _LOOSE_CALL.fullmatch(text)
    try:
        call = json.loads(match[1] or match[2]) if match else None
    except ValueError:
        return None
    shaped = isinstance(call, dict) and call.keys() == {"name", "arguments"}
    return call if shaped and isinstance(call["name"], str) and isinstance(call["arguments"], dict) else None


def in_schema_order(value: Any, schema: Any, root: dict[str, Any]) -> Any:
    """`value` with every object's keys in the order its schema lists them, as the grammar writes them
    (JSON leaves the order free): nested objects, arrays' items and the parameters' own `#/...`
    references (pydantic's nested models) too. Keys the schema does not list go last."""
    for _ in range(8):  # a reference to a reference, but never round a circle
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#/")):
            break
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        schema = target
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(value, dict):
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        rank = {key: i for i, key in enumerate(properties)}
        return {key: in_schema_order(value[key], properties.get(key), root)
                for key in sorted(value, key=lambda key: rank.get(key, len(rank)))}
    if isinstance(value, list):
        return [in_schema_order(item, schema.get("items"), root) for item in value]
    return value


def _may_become_loose_call(text: str) -> bool:
    """Whether more text could make `text` a `loose_call` (so it is held back from streaming)."""
    rest = text.lstrip()
    if rest.startswith("```"):
        rest = rest[3:]
        if "json".startswith(rest):
            return True
        rest = rest.removeprefix("json").lstrip()
    elif "```".startswith(rest):
        return True
    return not rest or rest.startswith("{")


# A call's JSON as far as its arguments' opening brace (its name first, as the grammar writes it); the
# json style's opening, and what lies between two of its calls.
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')
_JSON_CALLS = re.compile(r'\s*\{\s*"tool_calls?"\s*:\s*\[?')
_NEXT_CALL = re.compile(r'\s*\}\s*,')
_TEXT_ANSWER = re.compile(r'\s*\{\s*"response"\s*:\s*"')  # a json reply's text answer begins
_ANSWER_CHARS = re.compile(r'(?:[^"\\]|\\u[0-9a-fA-F]{4}|\\["\\/bfnrt])*')  # its string's whole characters
_SPACE = re.compile(r"\s*")
_DECODER = json.JSONDecoder()
_JSON_PART = re.compile(r'["{}\[\]]')  # a string's opening quote, or a bracket
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*(")?', re.S)  # a string's characters, and its closing quote if written


def _after(text: str, marker: str, start: int) -> int:
    at = text.find(marker, start)
    return at + len(marker) if at >= 0 else -1


def _json_end(text: str, start: int, scanned: dict[int, tuple[int, int, bool]]) -> int | None:
    """Where the JSON object or array at `start` ends, None where the text ends first. `scanned[start]`:
    how far an earlier call read a beginning of this text, the depth there, and whether inside a string."""
    at, depth, in_string = scanned.get(start, (start, 0, False))
    while True:
        if in_string:
            rest = _STRING_REST.match(text, at)
            at = rest.end()
            if rest[1] is None:  # the string goes on past the text (an escape begun at its end left unread)
                scanned[start] = (at, depth, True)
                return None
        part = _JSON_PART.search(text, at)
        if part is None:
            scanned[start] = (len(text), depth, False)
            return None
        at, in_string = part.end(), part[0] == '"'
        if part[0] in "{[":
            depth += 1
        elif part[0] in "}]":
            depth -= 1
            if depth == 0:
                return at


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


# OpenAI: a function defined without parameters takes none.
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def _call_schema(function: dict[str, Any], index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A call of `function` as JSON (its name, then arguments that follow its parameters' schema), and
    that schema as a definition for the root of the grammar's schema: the references inside it
    (`#/$defs/...`, pydantic's nested models) resolve against the whole schema's root, so they are
    re-pointed to where the parameters sit there."""
    where = f"arguments{index}"
    parameters = _rebased(function.get("parameters") or NO_PARAMETERS, f"#/$defs/{where}")
    return _object({"name": {"const": function["name"]}, "arguments": {"$ref": f"#/$defs/{where}"}}), {where: parameters}


def _rebased(schema: Any, base: str) -> Any:
    """`schema` with each local reference ("#/...") made relative to `base`."""
    if isinstance(schema, dict):
        return {key: base + value[1:] if key == "$ref" and isinstance(value, str) and value.startswith("#")
                else _rebased(value, base) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_rebased(item, base) for item in schema]
    return schema


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(call: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id(), "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}


def tool_style_for(template: str | None, special_marker: bool) -> ToolStyle:
    """hermes where the chat template writes <tool_call> (and renders `tools`), json otherwise."""
    if template and OPEN in template and "tools" in template:
        return ToolStyle("hermes", special_marker)
    return ToolStyle("json")
