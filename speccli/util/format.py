"""Numbers and names as people (and JSON parsers) read them."""
from __future__ import annotations

import math
import os
from typing import Any


def format_size(size_bytes: int | None) -> str:
    if size_bytes is None:
        return "unknown"
    size = float(size_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def counted(n: int, noun: str) -> str:
    """'1 sequence', '2 sequences': a count and its noun, plural where it is not 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def one_line(text: str) -> str:
    """`text` with anything unprintable (a newline, a terminal's escape) written as its escape: a listing's
    line stays one line, whatever a file name holds."""
    return "".join(character if character.isprintable() else repr(character)[1:-1] for character in text)


def escape_undecodable(text: str) -> str:
    """`text` with each byte that is not UTF-8 (a file name's, which reaches Python as a surrogate
    escape) written as `\\udce9`, as Python writes it on stderr."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_safe(value: Any) -> Any:
    """`value` (dicts, lists, strings, paths, numbers) as valid JSON takes it: every string and path
    through `escape_undecodable` (JSON text is UTF-8: one file name that is not made a report no parser
    would read), and a float that is not finite as null (JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, os.PathLike)):
        return escape_undecodable(os.fspath(value))
    if isinstance(value, dict):
        return {json_safe(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value
