"""A GGUF's Jinja chat template, rendered by llama-cpp-python's own Jinja2ChatFormatter, so that
speccli's prompts are exactly those `Llama.create_chat_completion` would build (the same sandbox,
`{% generation %}` tags, `tojson`, `strftime_now`, `raise_exception`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from speccli.errors import SpeccliError


class TemplateSyntaxError(SpeccliError):
    """The template does not parse: the caller may fall back to another format."""


class ChatTemplate:
    def __init__(self, template: str, bos_token: str, eos_token: str) -> None:
        try:
            self._formatter = Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=True)
        except jinja2.TemplateError as error:
            raise TemplateSyntaxError(f"the chat template does not parse ({error})") from None

    def render(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The conversation, and the start of the assistant's reply to it (the generation prompt); `tools`
        in OpenAI's form, for templates that write them."""
        try:
            return self._formatter(messages=list(messages), tools=tools).prompt
        except ValueError as error:  # the template's raise_exception(...)
            raise SpeccliError(f"the chat template refused the conversation: {error}") from None
        except jinja2.TemplateError as error:
            raise SpeccliError(f"the chat template failed: {error}") from None
