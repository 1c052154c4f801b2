"""The OpenAI request bodies the server accepts, checked with pydantic, and the speccli extension field.

Ranges follow OpenAI's where it has them (temperature 0-2, top_p (0, 1]) and llama.cpp's server for
what OpenAI lacks (top_k, min_p). Defaults are speccli chat's (and llama.cpp's); a null is the default,
as OpenAI's API has it. Unknown fields are ignored, as OpenAI-compatible servers do, so clients that
send e.g. `user` work; OpenAI's parameters this server cannot honour (`UNSUPPORTED`) are refused
unless set to what means "off", since ignoring one would change what the response means unsaid.
"""
from __future__ import annotations

import difflib
import json
import re
from typing import Any, Callable, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from speccli.drafting.registry import SPECS
from speccli.server.tools import ToolRequest
from speccli.validation import MAX_TEMPERATURE, K, MAX_K


class Strict(BaseModel):
    """Values of the wrong JSON type are refused, not converted: "5" is not a max_tokens, nor true a 1."""

    model_config = ConfigDict(strict=True)
    shape: ClassVar[str] = "{...}"  # what the object looks like, for a value that is none

    # The messages say what is allowed, not pydantic's type names ("a valid dictionary or instance of TextPart").
    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"must be an object: {cls.shape}")
        return value


class TextPart(Strict):
    shape = '{"type": "text", "text": ...}'
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    shape = '{"name": ..., "arguments": "{...}"}'
    name: str
    arguments: str  # a JSON object, as text (OpenAI's form)

    @field_validator("arguments")
    @classmethod
    def _a_json_object(cls, arguments: str) -> str:
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ValueError("must be a JSON object, as text")
        if first_at(parsed, is_surrogate_text) is not None:  # read here, not with the body: the template writes them
            raise ValueError("holds a lone UTF-16 surrogate escape (such as \\ud800), which is no character")
        return arguments


# JSON's "\ud800" parses to a lone surrogate, which cannot be encoded as UTF-8 for the tokenizer.
SURROGATE = re.compile("[\ud800-\udfff]")


def is_surrogate_text(value: object) -> bool:
    return isinstance(value, str) and SURROGATE.search(value) is not None


def first_at(value: object, wrong: Callable[[object], bool], path: str = "") -> str | None:
    """The field path of the first value or key in parsed JSON that is `wrong`, None if there is none."""
    if wrong(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        here = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict) and wrong(key):
            return here
        if (found := first_at(item, wrong, here)) is not None:
            return found
    return None


class ToolCall(Strict):
    shape = '{"id": ..., "type": "function", "function": {...}}'
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Strict):
    shape = '{"role": ..., "content": ...}'
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # In this order: each field's check reads the ones before it.
    tool_calls: Optional[list[ToolCall]] = None  # an assistant's calls, as it made them
    tool_call_id: Optional[str] = Field(None, validate_default=True)  # a tool's result: the call it answers
    content: Union[str, list[TextPart], None] = Field(None, validate_default=True)

    @field_validator("tool_calls")
    @classmethod
    def _an_assistants(cls, calls: Any, info: ValidationInfo) -> Any:
        if calls is not None and info.data.get("role") != "assistant":
            raise ValueError("only an assistant's message has them")
        return calls

    @field_validator("tool_call_id")
    @classmethod
    def _a_tools(cls, call_id: Any, info: ValidationInfo) -> Any:
        if call_id is None and info.data.get("role") == "tool":
            raise ValueError("a tool's message names the call it answers")
        return call_id

    @field_validator("content", mode="before")
    @classmethod
    def _text_or_parts(cls, content: Any, info: ValidationInfo) -> Any:
        if content is None and info.data.get("role") == "assistant" and info.data.get("tool_calls"):
            return content
        if not isinstance(content, (str, list)):
            raise ValueError(f"must be text, or a list of text parts: {TextPart.shape}")
        return content

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)

    def as_template_message(self) -> dict[str, Any]:
        # Chat templates know system, user and assistant; OpenAI's "developer" is its new name for system.
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:  # templates write the arguments as JSON themselves
            message["tool_calls"] = [{"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": json.loads(call.function.arguments)}} for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionDefinition(Strict):
    shape = '{"name": ..., "description": ..., "parameters": {...}}'
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON schema of the arguments object
    strict: Optional[bool] = None  # every call follows the parameters either way

    @field_validator("parameters")
    @classmethod
    def _an_object(cls, parameters: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        # A call's arguments are an object (OpenAI's), which a call read back from the history must be too.
        kind = (parameters or {}).get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            raise ValueError(f'must describe the arguments as an object ("type": "object"), got "type": {json.dumps(kind)}')
        return parameters

    def definition(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, exclude={"strict"})


class Tool(Strict):
    shape = '{"type": "function", "function": {...}}'
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Strict):
    shape = '{"name": ...}'
    name: str


class NamedToolChoice(Strict):
    shape = '{"type": "function", "function": {"name": ...}}'
    type: Literal["function"]
    function: FunctionName


class SpeculationControl(Strict):
    """The `speculative` extension field: `{"enabled": false}` for the target alone, or a spec and k."""

    model_config = ConfigDict(extra="forbid")  # merged with Strict's

    enabled: bool = True
    spec: Optional[Literal[SPECS]] = None  # type: ignore[valid-type]  (default: the server's --spec)
    k: Optional[K] = None  # None: not given (the server's --k); range checked by `_k`

    shape = '{"spec": ..., "k": ...}, or {"enabled": false} for the target alone'

    # Not pydantic's "a valid integer" for k: "AUTO".
    @field_validator("k", mode="before")
    @classmethod
    def _k(cls, value: Any) -> Any:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value is None or value == "auto" or (whole and 1 <= value <= MAX_K):
            return value
        raise ValueError(f"must be \"auto\" or a whole number from 1 to {MAX_K}, got {value!r}")

    @model_validator(mode="after")
    def _nothing_asked_of_a_target_alone(self) -> SpeculationControl:
        if not self.enabled and (self.spec is not None or self.k is not None):
            raise ValueError("enabled: false runs the target alone, which takes no spec or k; leave them out")
        return self


class StreamOptions(Strict):
    shape = '{"include_usage": true}'
    include_usage: bool = False  # one more chunk at the end, with no choices and the usage


# OpenAI parameters with no counterpart here, each with the values that ask for nothing (all others: 400).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "functions": (None, []), "function_call": (None, "none", "auto"),
    "echo": (None, False), "suffix": (None, ""), "best_of": (None, 1),
    "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,),
    # Other servers' fields that change the reply (llama-server's, vLLM's): ignored, the reply would
    # look as if they had applied. llama-server's `grammar` and `json_schema` are served.
    "repeat_penalty": (None, 1), "repetition_penalty": (None, 1), "typical_p": (None, 1), "mirostat": (None, 0),
    "min_tokens": (None, 0), "ignore_eos": (None, False), "n_predict": (None, -1), "dry_multiplier": (None, 0),
    "xtc_probability": (None, 0), "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,),
    "guided_grammar": (None,),
}


def unsupported_parameter(body: dict[str, Any]) -> str | None:
    """The first parameter of UNSUPPORTED that `body` sets to ask for something, if any. A bool is
    compared with bools only: `"best_of": true` is not a best_of of 1."""
    for name, off in UNSUPPORTED.items():
        value = body.get(name)
        asks_nothing = any(value == nothing and isinstance(value, bool) == isinstance(nothing, bool) for nothing in off)
        if name in body and not asks_nothing:
            return name
    return None


def misspelt_parameter(body: dict[str, Any], schema: type[BaseModel]) -> tuple[str, str] | None:
    """A top-level field that is not the request's but nearly one of its fields ("max_token", "Stream"),
    and that field; None where there is none. Ignored, as the fields of other servers and newer APIs
    that clients send are, its setting would be lost. Other servers' own fields are not that near
    (llama-cpp-python's logit_bias_type: 0.8 of logit_bias's)."""
    known = [field.alias or name for name, field in schema.model_fields.items()] + list(UNSUPPORTED)
    for name in body:
        if name not in known:
            spelt = [field for field in known if field == name.lower().replace("-", "_")]
            if close := spelt or difflib.get_close_matches(name, known, n=1, cutoff=0.85):
                return name, close[0]
    return None


class JsonSchemaFormat(Strict):
    shape = '{"name": ..., "schema": {...}, "strict": true}'
    name: str = "response"
    description: Optional[str] = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: Optional[bool] = None  # every reply follows the schema either way


class ResponseFormat(Strict):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON following a schema; and
    llama-server's `{"type": "json_object", "schema": {...}}` (instructor's JSON_SCHEMA mode sends it),
    which had been read as any JSON object, its schema dropped."""

    shape = '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}'
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('json_schema: give it with type "json_schema" and only then')
        if self.schema_ is not None and self.type != "json_object":
            raise ValueError('schema: give it with type "json_object" (llama-server\'s form), or as json_schema.schema')
        return self


class GenerationRequest(Strict):
    """What chat and text completions share."""

    model: str
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: float = Field(0.8, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float = Field(0.95, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(40, ge=0)
    min_p: float = Field(0.05, ge=0, lt=1, allow_inf_nan=False)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = Field(None, ge=-1)  # -1: none, a random stream (llama-server's)
    n: int = Field(1, ge=1, le=1)  # one sequence at a time: one choice
    speculative: Optional[SpeculationControl] = None
    response_format: Optional[ResponseFormat] = None
    grammar: Optional[str] = None  # llama-server's field: a grammar in GBNF (or Lark) syntax
    json_schema: Optional[dict[str, Any]] = None  # llama-server's field: the reply follows this JSON schema

    @field_validator("seed")
    @classmethod
    def _minus_one_is_none(cls, seed: Optional[int]) -> Optional[int]:
        return None if seed == -1 else seed

    @field_validator("stream", "temperature", "top_p", "top_k", "min_p", "n", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: Union[str, list[str], None]) -> Union[str, list[str], None]:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError(f"at most 4 stop sequences, got {len(stop)}")
        if isinstance(stop, list) and any(not s for s in stop) or stop == "":
            raise ValueError("stop sequences must not be empty")
        return stop

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_token_limit(cls, limit: Optional[int], info: ValidationInfo) -> Optional[int]:
        given = info.data.get("max_tokens")
        if None not in (given, limit) and given != limit:
            raise ValueError(f"differs from max_tokens ({limit} against {given}): give one of them")
        return limit

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def answer_schema(self) -> tuple[dict[str, Any], str] | None:
        """The JSON schema a reply follows and the field that gives it: response_format's, or
        llama-server's json_schema (None: neither asks for JSON)."""
        form = self.response_format
        if self.json_schema is not None:
            return self.json_schema, "json_schema"
        if form is None or form.type == "text":
            return None
        if form.type == "json_schema":
            return form.json_schema.schema_, "response_format.json_schema.schema"
        return ({"type": "object"}, "json_object") if form.schema_ is None else (form.schema_, "response_format.schema")


class ChatCompletionRequest(GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None  # None: "auto" with tools
    parallel_tool_calls: Optional[bool] = None  # None: true, as OpenAI has it

    @field_validator("tools")
    @classmethod
    def _named_once(cls, tools: Optional[list[Tool]]) -> Optional[list[Tool]]:
        names = [tool.function.name for tool in tools or ()]
        if len(set(names)) < len(names):
            raise ValueError(f"two are named {next(n for n in names if names.count(n) > 1)!r}")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _a_choice_among_the_tools(cls, choice: Any, info: ValidationInfo) -> Any:
        names = [tool.function.name for tool in info.data.get("tools") or ()]
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"no tool is named {choice.function.name!r}")
        if choice not in (None, "none", "auto") and not names:
            raise ValueError("asks for a tool call, and tools gives none")
        return choice

    def unanswered_tool_result(self) -> int | None:
        """The first tool's message that answers no call of the assistant's message before it (OpenAI
        refuses such a conversation: a model shown a result of no call writes nonsense); None if none."""
        calls: set[str] = set()
        for i, message in enumerate(self.messages):
            if message.role == "assistant":
                calls = {call.id for call in message.tool_calls or ()}
            elif message.role == "tool" and message.tool_call_id not in calls:
                return i
        return None

    def tool_request(self) -> ToolRequest | None:
        if not self.tools and self.tool_choice is None:
            return None
        choice = self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice
        answer = self.answer_schema()
        return ToolRequest(tuple(tool.function.definition() for tool in self.tools or ()), choice or "auto",
                           self.parallel_tool_calls is not False, None if answer is None else answer[0])


class CompletionRequest(GenerationRequest):
    prompt: Union[str, list[int]]  # text, or token ids taken as they are
    tools: Optional[list[Any]] = None  # chat's: refused here, by name

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: Optional[list[Any]]) -> None:
        if tools:
            raise ValueError("only chat completions (/v1/chat/completions) call tools")

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        """OpenAI's forms: text, token ids, or a list of either, a batch; one sequence runs at a time, so
        a batch holds one."""
        if isinstance(prompt, list) and prompt and all(isinstance(item, (str, list)) for item in prompt):
            if len(prompt) > 1:
                raise ValueError(f"one prompt at a time, got {len(prompt)}")
            prompt = prompt[0]
        if not isinstance(prompt, (str, list)):
            raise ValueError("must be text or token ids, or a list holding one of either")
        if prompt in ("", []):
            raise ValueError("the prompt is empty")
        if isinstance(prompt, list) and not all(type(token) is int and token >= 0 for token in prompt):
            raise ValueError("token ids must be whole numbers >= 0")
        return prompt
