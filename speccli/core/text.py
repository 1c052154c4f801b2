"""Token bytes -> the text a user sees, with stop strings honoured."""
from __future__ import annotations

import codecs
from typing import Sequence


def begins_a_stop(text: str, stops: Sequence[str]) -> bool:
    """Whether `text` is the beginning of a stop string: what a reply cut by a token limit had held back
    as it wrote a chat format's end-of-turn marker ("Hey\\nUser" at the plain transcript's "\\nUser:")."""
    return bool(text) and any(stop.startswith(text) for stop in stops)


class TextAssembler:
    """Token bytes -> text: never splits a UTF-8 character; holds back what may begin a stop string."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._held = ""
        self.stopped = False

    def push(self, data: bytes) -> str:
        self._held += self._decoder.decode(data)
        found = [at for at in (self._held.find(s) for s in self._stop) if at >= 0]
        if found:
            self.stopped = True
            text, self._held = self._held[: min(found)], ""
            return text
        hold = max(
            (n for s in self._stop for n in range(1, min(len(s), len(self._held) + 1)) if s.startswith(self._held[-n:])),
            default=0,
        )
        split = len(self._held) - hold
        text, self._held = self._held[:split], self._held[split:]
        return text

    def flush(self) -> str:
        """The text held back, at the reply's end. A character whose first bytes came but not the rest
        (a reply cut by its token limit mid-character) is left out rather than shown as U+FFFD: the
        decoder holds back only such bytes, having replaced bytes that begin no character as they came."""
        text, self._held = ("" if self.stopped else self._held), ""
        self._decoder.reset()
        return text
