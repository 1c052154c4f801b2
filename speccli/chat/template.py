"""Turning chat messages into the prompt text a model expects: its own chat template (rendered by
llama-cpp-python, see speccli/llama/chat_template.py), or a plain "User:/Assistant:" transcript for
models without one."""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from speccli.llama.chat_template import ChatTemplate, TemplateSyntaxError
from speccli.llama.tokenizer import Tokenizer

Message = dict[str, Any]  # role and content; tool_calls or tool_call_id where the server has them


class ChatFormat(Protocol):
    stop: tuple[str, ...]  # strings that end a reply, besides the model's end-of-generation tokens
    parse_special: bool  # whether special-token text in the rendering means the special token

    def render(self, messages: Sequence[Message], tools: list[dict[str, Any]] | None = None) -> str:
        """The conversation, and the start of the assistant's reply to it (`tools` for templates that
        write them)."""


class TemplateFormat:
    """The GGUF's own Jinja chat template."""

    stop = ()  # the template's end-of-turn token is an end-of-generation token
    parse_special = True

    def __init__(self, template: str, bos_token: str, eos_token: str) -> None:
        self._template = ChatTemplate(template, bos_token, eos_token)

    def render(self, messages: Sequence[Message], tools: list[dict[str, Any]] | None = None) -> str:
        return self._template.render(messages, tools)


class PlainTranscript:
    """For models without a template (base models): "User: ..." / "Assistant: ..." lines."""

    stop = ("\nUser:",)
    parse_special = False

    def render(self, messages: Sequence[Message], tools: list[dict[str, Any]] | None = None) -> str:
        parts = []
        for message in messages:
            if message["role"] == "system":
                parts.append(f"{message['content']}\n\n")
            elif message["role"] == "user":
                parts.append(f"User: {message['content']}\n")
            else:
                # The reply as generated (usually with its leading space), so the transcript
                # re-renders to exactly the text the model saw.
                parts.append(f"Assistant:{message['content']}\n")
        parts.append("Assistant:")
        return "".join(parts)


def tokenize_rendered(tokenizer: Tokenizer, chat_format: ChatFormat, text: str) -> list[int]:
    """A whole rendered conversation as tokens. Templates usually write the BOS token themselves; it is
    added only where they do not (no double BOS)."""
    tokens = tokenizer.tokenize(text, False, chat_format.parse_special)
    if tokenizer.adds_bos and tokens[:1] != [tokenizer.bos_id]:
        tokens.insert(0, tokenizer.bos_id)
    return tokens


def chat_format_for(tokenizer: Tokenizer) -> tuple[ChatFormat, str | None]:
    """The format to use and, when it is the fallback, why (to tell the user once)."""
    template = tokenizer.chat_template
    if not template:
        return PlainTranscript(), "the target has no chat template (a base model?)"
    try:
        return TemplateFormat(template, tokenizer.token_text(tokenizer.bos_id), tokenizer.token_text(tokenizer.eos_id)), None
    except TemplateSyntaxError as error:
        return PlainTranscript(), f"the target's {error}"
