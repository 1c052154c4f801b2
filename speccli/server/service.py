"""What the routes serve (`Service`): the loaded models, the default drafting configuration, the
worker, and a request's prompt, generation limits and drafting as these models take them."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from speccli.chat.template import ChatFormat, chat_format_for, tokenize_rendered
from speccli.core.constraint import Grammar, GrammarError, GrammarSpec, check_grammar
from speccli.core.generator import GenerationLimits
from speccli.llama.model import Model, shared_context
from speccli.server.api_errors import APIError
from speccli.server.metrics import Metrics
from speccli.server.schemas import ChatCompletionRequest, GenerationRequest, SpeculationControl
from speccli.server.tools import CLOSE, OPEN, ToolRequest, in_schema_order, tool_style_for
from speccli.server.worker import Speculation, Worker
from speccli.drafting.registry import default_spec
from speccli.drafting.registry import uses_draft_model


GRAMMARS_KEPT = 16


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
    aliases: frozenset[str] = frozenset()  # other names of the model a request may give (the pair's)

    def serves(self, model: str) -> bool:
        return model == self.model_id or model in self.aliases

    def __post_init__(self) -> None:
        tokenizer = self.target.tokenizer
        self.chat_format: ChatFormat
        self.chat_format, self.plain_transcript_reason = chat_format_for(tokenizer)  # the reason: None with a template
        self.tool_style = tool_style_for(tokenizer.chat_template, all(map(tokenizer.is_special_text, (OPEN, CLOSE))))
        self.created = int(time.time())
        # The last GRAMMARS_KEPT schemas and grammars compiled: clients send the same few again and again,
        # and each keeps what its masks cost to place (core/constraint.py's MaskPositions).
        self._grammars: dict[GrammarSpec, Grammar] = {}
        self._grammars_lock = threading.Lock()  # requests compile theirs in threads of their own

    @property
    def n_ctx(self) -> int:
        return shared_context(self.target, self.draft)

    def speculation_for(self, control: SpeculationControl | None) -> Speculation:
        if control is None:
            return self.default_speculation
        if not control.enabled:
            return Speculation(None, None)
        spec = control.spec or self.default_speculation.spec or default_spec(self.draft is not None)
        if uses_draft_model(spec) and self.draft is None:
            raise APIError(400, f"speculative.spec {spec!r} needs a draft model, and this server has none "
                           f"(start it with a draft, or use {default_spec(False)!r})", param="speculative.spec")
        k = self.default_speculation.k if control.k is None else control.k
        return Speculation(spec, k)

    def chat_prompt(self, messages: list[dict[str, Any]], tools: ToolRequest | None = None) -> list[int]:
        """Tokens for the messages (and tools) as the target's template renders them, as `speccli chat`
        tokenizes a conversation's first turn (so the same message gives the same reply)."""
        rendered = self.chat_format.render(self.tool_style.prompt_messages(messages, tools), self.tool_style.template_tools(tools))
        return tokenize_rendered(self.target.tokenizer, self.chat_format, rendered)

    def text_prompt(self, prompt: str | list[int]) -> list[int]:
        """Text as the tokenizer reads it (BOS first where the model wants one); token ids as given."""
        if isinstance(prompt, str):
            return self.target.tokenizer.tokenize(prompt, True, True)
        n_vocab = self.target.n_vocab
        if max(prompt) >= n_vocab:
            raise APIError(400, f"prompt: token id {max(prompt)} is past this model's vocabulary of {n_vocab}",
                           param="prompt")
        return prompt

    def grammar_spec_for(self, body: GenerationRequest) -> GrammarSpec | None:
        """What the request's text must follow: `response_format` (OpenAI's), or `grammar` (llama-server's),
        checked (400 naming the field) before the request waits for the worker. A stop string would cut
        such a reply short, which then ends as "stop" but not valid: refused with it."""
        spec = self._grammar_spec_for(body)
        if spec is not None and body.stop_strings():
            raise APIError(400, f"stop: a reply that follows {_field_of(spec)} would be cut by a stop string before "
                                "it is complete; leave stop out", param="stop")
        return spec

    def _grammar_spec_for(self, body: GenerationRequest) -> GrammarSpec | None:
        form = body.response_format
        given = [name for name, value in (("response_format", form is not None and form.type != "text"),
                                          ("grammar", body.grammar is not None), ("json_schema", body.json_schema is not None)) if value]
        if len(given) > 1:
            raise APIError(400, f"{' and '.join(given)}: give one of them", param=given[-1])
        if body.grammar is not None:
            asked = GrammarSpec("grammar", body.grammar, "grammar")
        elif (answer := body.answer_schema()) is not None:
            asked = GrammarSpec.json_schema(*answer)
        else:
            asked = None
        tools = body.tool_request() if isinstance(body, ChatCompletionRequest) else None
        if tools is None or not tools.calls:
            return None if asked is None else _checked(asked, given[0])
        if body.grammar is not None:
            raise APIError(400, "tools: a reply that may call a tool follows its grammar; leave out grammar "
                                "(response_format may go with tools), or set tool_choice to \"none\"", param="tools")
        if asked is not None:  # a reply that calls nothing follows it (`ToolRequest.answer`): checked as alone
            _checked(asked, given[0])
        for i, function in enumerate(tools.functions):
            if "parameters" in function:
                where = f"tools.{i}.function.parameters"
                _checked(GrammarSpec.json_schema(function["parameters"], where), where)
        return _checked(self.tool_style.grammar(tools), "tools")

    def grammar_for(self, spec: GrammarSpec | None) -> Grammar | None:
        """The checked spec for this target's vocabulary (llguidance's reader of it is built at the first
        one, in seconds: call it off the event loop)."""
        if spec is None:
            return None
        with self._grammars_lock:
            grammar = self._grammars.pop(spec, None)
        if grammar is None:
            try:
                grammar = Grammar(spec, self.target.tokenizer.grammar_vocabulary(), self.target.n_vocab)
            except GrammarError as error:
                raise APIError(400, str(error), param=_field_of(spec)) from None
        with self._grammars_lock:
            while len(self._grammars) >= GRAMMARS_KEPT:
                del self._grammars[next(iter(self._grammars))]
            self._grammars[spec] = grammar  # the newest last
        return grammar

    def loose_calls(self, tools: ToolRequest | None) -> Callable[[dict[str, Any]], bool] | None:
        """Under `auto` with a hermes template, whether a call the model wrote as the reply's bare JSON
        (tools.py's `loose_call`) names a tool offered and holds arguments its parameters take, checked by
        the grammar a call in <tool_call> follows; None where such calls are not read."""
        if tools is None or not tools.calls or tools.choice != "auto" or self.tool_style.name != "hermes":
            return None

        def offered(call: dict[str, Any]) -> bool:
            function = next((f for f in tools.functions if f["name"] == call["name"]), None)
            if function is None:
                return False
            try:
                grammar = self.grammar_for(self.tool_style.call_grammar(function))
            except APIError:  # its parameters compiled for the request's own grammar: not expected
                return False
            parameters = function.get("parameters") or {}
            arguments = in_schema_order(call["arguments"], parameters, parameters)
            text = json.dumps({"name": call["name"], "arguments": arguments}, ensure_ascii=False)
            return grammar.start().accepts(self.target.tokenizer.tokenize(text, add_special=False))

        return offered

    def limits_for(self, prompt: Sequence[int], body: GenerationRequest, stop: tuple[str, ...],
                   grammar: Grammar | None = None) -> GenerationLimits:
        """Refuses a prompt, or prompt plus max_tokens, that the context cannot hold (as OpenAI does);
        without max_tokens a reply may fill the context."""
        room = self.n_ctx - len(prompt)
        requested = body.token_limit()
        if room < 1 or (requested is not None and requested > room):
            asked = f" plus {requested} max_tokens" if requested is not None else ""
            raise APIError(
                400, f"this model's context holds {self.n_ctx} tokens; the prompt has {len(prompt)}{asked}",
                param="max_tokens" if room >= 1 and requested is not None else "messages" if isinstance(body, ChatCompletionRequest)
                else "prompt", code="context_length_exceeded",
            )
        return GenerationLimits(requested if requested is not None else room, stop + body.stop_strings(), grammar)


def _field_of(spec: GrammarSpec) -> str:
    """The request's field a grammar came from."""
    return ("tools" if spec.name == "tools" else "grammar" if spec.kind == "grammar"
            else "json_schema" if spec.name == "json_schema" else "response_format")


def _checked(spec: GrammarSpec, field: str) -> GrammarSpec:
    try:
        check_grammar(spec)
    except GrammarError as error:
        raise APIError(400, str(error), param=field) from None
    return spec
