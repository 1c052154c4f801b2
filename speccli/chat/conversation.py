"""A chat's messages and the exact tokens the models have been shown for them (`Conversation`).

KV reuse. The Generator keeps both models' KV caches and re-decodes only past the longest common
token prefix of its last sequence and the new prompt. So each turn's prompt must *start with the
exact tokens* the models already saw: the previous prompt and the reply tokens as generated.
Re-tokenizing the whole transcript would not guarantee that (a reply's tokens need not be how the
tokenizer would split its text), so the conversation keeps its token list and the text it stands
for, renders the whole transcript, and tokenizes only the text past what was already fed. When the
rendering does not extend that text (a template that trims replies, a stop string cut mid-token),
the transcript is tokenized whole and the Generator still reuses whatever prefix matches.
"""
from __future__ import annotations

from dataclasses import dataclass

from speccli.chat.template import ChatFormat, Message, tokenize_rendered
from speccli.llama.tokenizer import Tokenizer


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str  # what the tokens stand for: the whole rendered transcript


class Conversation:
    """The messages, plus the exact tokens the models have been shown for them (see module docstring)."""

    def __init__(self, tokenizer: Tokenizer, chat_format: ChatFormat, system: str | None) -> None:
        self.tokenizer = tokenizer
        self.format = chat_format
        self.system = system
        self.turns: list[tuple[Message, Message]] = []  # (user, assistant)
        self._fed_tokens: list[int] = []
        self._fed_text = ""

    def messages(self) -> list[Message]:
        messages = self._system_messages()
        for user, assistant in self.turns:
            messages += [user, assistant]
        return messages

    def prompt_for(self, user_text: str) -> Prompt:
        text = self.format.render(self.messages() + [{"role": "user", "content": user_text}])
        if self._fed_tokens and text.startswith(self._fed_text):
            new_text = text[len(self._fed_text) :]
            tokens = self._fed_tokens + self.tokenizer.tokenize(new_text, False, self.format.parse_special)
        else:
            tokens = tokenize_rendered(self.tokenizer, self.format, text)
        return Prompt(tokens, text)

    def prompt_alone(self, user_text: str) -> Prompt:
        """The prompt for `user_text` with every earlier turn left out (the system prompt kept)."""
        messages = self._system_messages() + [{"role": "user", "content": user_text}]
        text = self.format.render(messages)
        return Prompt(tokenize_rendered(self.tokenizer, self.format, text), text)

    def _system_messages(self) -> list[Message]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def add_turn(self, user_text: str, prompt: Prompt, reply_tokens: list[int], reply_text: str) -> None:
        """Record a finished (or interrupted) reply. The end-of-turn token, if any, is not kept: the
        template writes it again next turn, and the Generator finds the same token already cached."""
        self.turns.append(({"role": "user", "content": user_text}, {"role": "assistant", "content": reply_text}))
        self._fed_tokens = prompt.tokens + reply_tokens
        self._fed_text = prompt.text + self.tokenizer.detokenize(reply_tokens).decode("utf-8", "replace")

    def drop_oldest_turn(self) -> None:
        del self.turns[0]
        self._forget_tokens()

    def set_system(self, system: str | None) -> None:
        self.system = system
        self._forget_tokens()

    def clear(self) -> None:
        self.turns.clear()
        self._forget_tokens()

    def _forget_tokens(self) -> None:
        """The transcript's beginning changed: the next prompt is tokenized whole."""
        self._fed_tokens, self._fed_text = [], ""
