"""Numbers and names as people (and JSON parsers) read them."""
from __future__ import annotations

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


def readable(text: str) -> str:
    """`text` with each byte that is not UTF-8 (a file name's, which reaches Python as a surrogate
    escape) written as `\\udce9`, as Python writes it on stderr."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_safe(value: Any) -> Any:
    """`value` (dicts, lists, strings, paths, numbers) with every string and path `readable`: JSON text
    must be UTF-8, and one file name that is not made a report that no parser would read."""
    if isinstance(value, (str, os.PathLike)):
        return readable(os.fspath(value))
    if isinstance(value, dict):
        return {json_safe(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value
