"""A GGUF model's files, checked before llama.cpp opens them, each check raising UnreadableFileError in one
line and each stricter than the one before:
* `require_gguf`: a readable file that begins as GGUF does (4 bytes read);
* `require_whole_gguf`: and its header is whole, and its size holds every tensor the header lists;
* `require_loadable_gguf`: nothing llama.cpp would fail on, or abort the process over, as it loads it.

A model split across files (gguf-split) is checked part by part: `model_files` names its parts.
The header is read with `speccli.gguf_meta`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from speccli.errors import UnreadableFileError, unreadable
from speccli.gguf_meta import check_gguf_magic, needed_size, read_gguf_header

_TOKENS = "tokenizer.ggml.tokens"
SPLIT_COUNT = "split.count"
# llama.cpp's naming for a model split across files (gguf-split): it is given the first part.
SPLIT_PART = re.compile(r"(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf")


def require_gguf(path: Path) -> None:
    """Raise UnreadableFileError unless `path` is a readable file that starts as a GGUF file does (its
    first 4 bytes only: a check cheap enough for every model `pull` reports)."""
    try:
        with path.open("rb") as file:
            check_gguf_magic(path, file.read(4))
    except OSError as error:
        raise unreadable(path, error) from None


def _require_size(path: Path, needed: int | None) -> None:
    """Raise UnreadableFileError where `path` has fewer than `needed` bytes (see `needed_size`)."""
    try:
        size = path.stat().st_size
    except OSError as error:
        raise unreadable(path, error) from None
    if needed is not None and size < needed:
        raise UnreadableFileError(f"{path}: cut short: {size:,} bytes of the {needed:,} its tensors need")


def require_whole_gguf(path: Path) -> None:
    """Raise UnreadableFileError unless `path` is a readable GGUF file whose header is whole and whose
    size holds every tensor it lists (where their types say how big they are): the damage a copy, a
    download or a write cut short leaves, found without reading the tensor data."""
    _require_size(path, needed_size(path))


def require_loadable_gguf(
    path: Path, *, weights: bool, header: tuple[dict[str, Any], int | None] | None = None
) -> None:
    """Raise UnreadableFileError, in one line, for what llama.cpp would fail on or abort the process
    over as it loads `path`: anything not GGUF, a header cut short, a vocabulary that holds one token's
    text twice (a GGML_ASSERT in llama.cpp's vocabulary loader), and where the weights are wanted, a
    file cut short of its tensors, or a split model's later part cut short or missing.

    `header`: the metadata (with the tokens and SPLIT_COUNT) and needed size a caller has read already
    with `read_gguf_header`, so that the header is not read twice."""
    metadata, needed = header if header is not None else _header_of(path)
    tokens = metadata.get(_TOKENS)
    if isinstance(tokens, list):
        _require_distinct_tokens(path, tokens)
    if weights:
        _require_size(path, needed)
        for part in _split_parts(path, metadata.get(SPLIT_COUNT))[1:]:  # llama.cpp opens them itself
            require_whole_gguf(part)


def _header_of(path: Path) -> tuple[dict[str, Any], int | None]:
    metadata, _, needed = read_gguf_header(path, lambda key: key in (_TOKENS, SPLIT_COUNT))
    return metadata, needed


def model_files(first: Path) -> list[Path]:
    """Every file of the model `first` begins: a split model's parts (gguf-split), `first` first, as
    llama.cpp opens them; just `first` otherwise. Raises UnreadableFileError where `first`, named as a
    split's first part, is no GGUF."""
    if not SPLIT_PART.fullmatch(first.name):  # no first part's name: one file, and no header to read
        return [first]
    metadata, _, _ = read_gguf_header(first, lambda key: key == SPLIT_COUNT)
    return _split_parts(first, metadata.get(SPLIT_COUNT))


def split_part_names(prefix: str, count: int) -> list[str]:
    """The file names of a model split in `count` parts, first part first, as llama.cpp looks for them
    beside the first ("<prefix>-00002-of-00003.gguf")."""
    return [f"{prefix}-{index:05d}-of-{count:05d}.gguf" for index in range(1, count + 1)]


def _split_parts(first: Path, count: Any) -> list[Path]:
    """Every file of a model split in `count` parts (gguf-split), `first` first; just `first` where its
    name is not a first part's, for llama.cpp to refuse in its own words."""
    named = SPLIT_PART.fullmatch(first.name)
    if not isinstance(count, int) or count < 2 or not named or named["index"] != "00001" or int(named["count"]) != count:
        return [first]
    return [first.with_name(name) for name in split_part_names(named["prefix"], count)]


def _require_distinct_tokens(path: Path, tokens: list[bytes]) -> None:
    """Raise UnreadableFileError where two ids of the vocabulary have the same text as llama.cpp reads
    it: a C string (up to a NUL byte), an empty one renamed "[EMPTY_<id>]"."""
    if len(set(tokens)) == len(tokens) and b"" not in tokens and b"\0" not in b"".join(tokens):
        return  # the usual case, in a few ms
    as_read = [text.split(b"\0", 1)[0] or b"[EMPTY_%d]" % token_id for token_id, text in enumerate(tokens)]
    if len(set(as_read)) == len(as_read):
        return
    first_id: dict[bytes, int] = {}
    for token_id, text in enumerate(as_read):
        if text in first_id:
            raise UnreadableFileError(
                f"{path}: its vocabulary holds the token {text.decode('utf-8', 'replace')!r} twice (ids "
                f"{first_id[text]} and {token_id}), which llama.cpp cannot load"
            )
        first_id[text] = token_id
