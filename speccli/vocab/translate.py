"""Text drafted by a model of another vocabulary, as the target's tokens after the context (SLEM's
re-tokenization: docs/drafting.md, *A draft of another vocabulary*)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.tokenizer import Tokenizer

WINDOW = 4  # target tokens of context re-tokenized with the drafted text, to find where the proposal starts


def translate(target: Tokenizer, context: Sequence[int], drafted_text: bytes) -> list[int]:
    """Target ids of `drafted_text` as it follows the context; [] where they cannot be told apart."""
    drafted_text = whole_words(drafted_text)
    if not drafted_text:
        return []
    for size in (WINDOW, 1):
        window = list(context[-size:])
        ids = target.tokenize(target.detokenize(window, special=True) + drafted_text, add_special=False, parse_special=True)
        if ids[:len(window)] == window:
            return ids[len(window):]
    return []


def whole_words(text: bytes) -> bytes:
    """`text` without the word it may end in the middle of (the text after it could have made that word
    other tokens), and the space before that word (tokenizers join a space to the word after it)."""
    end = len(text)
    while end and _in_word(text[end - 1]):
        end -= 1
    if end == len(text):
        return text
    return text[:end - 1] if text[end - 1:end] == b" " else text[:end]


def _in_word(byte: int) -> bool:
    return byte >= 0x80 or chr(byte).isalnum() or byte == ord("_")  # UTF-8 beyond ASCII counts as letters
