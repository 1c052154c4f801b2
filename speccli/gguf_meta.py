"""A fast GGUF header reader: the key/value metadata and the tensor table, never the tensor data.

gguf's GGUFReader takes ~10 s on Gemma 3 270M (262,144 tokens), so this module parses the GGUF
header itself and stops at the end of the key-value section (or of the tensor table, for the size a
whole file has): ~0.07 s for that file, whatever its size.
tests/test_gguf_meta.py cross-checks it against gguf.GGUFReader on real files. The checks of a model's
files built on it are in `speccli.gguf_files`.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from speccli.errors import UnreadableFileError, unreadable

# GGUF value types (gguf spec): id -> struct format of a scalar, or None for string/array.
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_KV_COUNT = 1 << 20  # far above any real file; guards against garbage headers
_MAX_NESTING = 8  # arrays of arrays: none in real files; deeper is a crafted header
_MAX_DIMS = 8  # GGML_MAX_DIMS is 4; anything past this is a garbage header
_DEFAULT_ALIGNMENT = 32  # where `general.alignment` is absent (gguf spec)
# ggml tensor types (ggml.h): id -> (elements per block, bytes per block). A tensor of another type
# leaves a file's size unknown (Q8_1, 9, is left out: only a compute type, its layout differs between
# versions). tests/test_gguf_meta.py checks these against gguf.GGML_QUANT_SIZES.
GGML_BLOCK_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17),
}


_Parsed = TypeVar("_Parsed")


class _Truncated(Exception):
    pass


def read_gguf_metadata(path: Path, wanted: Callable[[str], bool]) -> tuple[dict[str, Any], int]:
    """The key-value section of a GGUF file (values of `wanted` keys only) and its tensor count.

    Memory-maps the file and walks only the header and key-value section; tensor data is never touched,
    so the time depends on the vocabulary, not on the file size. String arrays come back as lists of
    bytes, numeric arrays as numpy arrays, strings as str.
    """
    metadata, tensor_count, _ = _parse(path, lambda data: _read_metadata(data, wanted))
    return metadata, tensor_count


def read_gguf_header(path: Path, wanted: Callable[[str], bool]) -> tuple[dict[str, Any], int, int | None]:
    """`read_gguf_metadata`'s values of `wanted` keys and tensor count, and `needed_size`, from one read
    of the header."""
    return _parse(path, lambda data: _read_header(data, wanted))


def needed_size(path: Path) -> int | None:
    """The bytes a GGUF file must have to hold every tensor its tensor table lists: the end of the
    furthest tensor's data. None where a tensor's type is one this reader does not know the size of.
    Raises UnreadableFileError where the header itself is cut short or corrupt."""
    return _remembered(path, _needed_sizes, lambda: read_gguf_header(path, lambda key: False)[2])


def trained_context_length(path: Path) -> int | None:
    """The context the model was trained with (`<arch>.context_length`), None when the file does not say."""
    def read() -> int | None:
        metadata, _ = read_gguf_metadata(path, lambda key: key == "general.architecture" or key.endswith(".context_length"))
        length = metadata.get(f"{metadata.get('general.architecture')}.context_length")
        return length if isinstance(length, int) else None

    return _remembered(path, _trained_lengths, read)


_needed_sizes: dict[tuple[str, int, int], int | None] = {}
_trained_lengths: dict[tuple[str, int, int], int | None] = {}


def _remembered(path: Path, found: dict[tuple[str, int, int], int | None], read: Callable[[], int | None]) -> int | None:
    """`read()` of `path`, remembered for the process by the file's path, size and mtime: a run looks a
    model up several times (a derived model checks its base too; a pair's context is fitted, checked,
    then loaded), and Gemma's header takes 40 ms to walk."""
    try:
        stat = path.stat()
    except OSError as error:
        raise unreadable(path, error) from None
    identity = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if identity not in found:
        found[identity] = read()
    return found[identity]


def check_gguf_magic(path: Path, first: bytes) -> None:
    """Raise UnreadableFileError unless `first`, a file's first 4 bytes, are GGUF's magic."""
    if len(first) < 4:
        raise UnreadableFileError(f"{path}: not a GGUF file ({'empty' if not first else 'too short'})")
    if first != b"GGUF":
        raise UnreadableFileError(f"{path}: not a GGUF file (starts with '{repr(first)[2:-1]}')")


def _parse(path: Path, parse: Callable[[mmap.mmap], _Parsed]) -> _Parsed:
    """`parse` over the memory-mapped file, its failures as one UnreadableFileError naming `path`."""
    try:
        with path.open("rb") as file:
            check_gguf_magic(path, file.read(4))
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                try:
                    return parse(data)
                except _Truncated:
                    raise UnreadableFileError(f"{path}: truncated or corrupt GGUF metadata") from None
                except ValueError as error:
                    raise UnreadableFileError(f"{path}: unsupported or corrupt GGUF file ({error})") from None
    except OSError as error:
        raise unreadable(path, error) from None


def _read_header(data: mmap.mmap, wanted: Callable[[str], bool]) -> tuple[dict[str, Any], int, int | None]:
    """The `wanted` metadata, and the size the tensor table says the file needs (see `needed_size`)."""
    metadata, tensor_count, reader = _read_metadata(data, lambda key: key == "general.alignment" or wanted(key))
    end, known = 0, True
    for _ in range(tensor_count):
        reader.string()  # the tensor's name
        n_dims = reader.unpack("I")
        if n_dims > _MAX_DIMS:
            raise _Truncated
        elements = 1
        for _ in range(n_dims):
            elements *= reader.unpack("Q")
        tensor_type, offset = reader.unpack("I"), reader.unpack("Q")
        if tensor_type not in GGML_BLOCK_SIZES:
            known = False  # read on: a table cut short is still damage to report
            continue
        block_elements, block_bytes = GGML_BLOCK_SIZES[tensor_type]
        end = max(end, offset + -(-elements // block_elements) * block_bytes)
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"general.alignment {alignment!r}")
    if not tensor_count:  # no data section, nor padding before it (llama.cpp seeks past it only for tensors):
        return metadata, tensor_count, reader.offset  # a vocabulary-only file may end right after its metadata
    data_start = -(-reader.offset // alignment) * alignment
    return metadata, tensor_count, data_start + end if known else None


def _read_metadata(data: mmap.mmap, wanted: Callable[[str], bool]) -> tuple[dict[str, Any], int, _Reader]:
    if len(data) < 8:  # the magic, and not all of the version after it
        raise _Truncated
    # A big-endian file has its version (2 or 3) in the high bytes when read little-endian.
    (version,) = struct.unpack_from("<I", data, 4)
    endian = "<" if version < 0x10000 else ">"
    reader = _Reader(data, endian, offset=8)
    if endian == ">":
        version = reader.unpack("I", at=4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}; speccli reads versions 2 and 3")
    tensor_count, kv_count = reader.unpack("Q"), reader.unpack("Q")
    if kv_count > _MAX_KV_COUNT:
        raise _Truncated
    metadata = {}
    for _ in range(kv_count):
        key = reader.string().decode("utf-8", errors="replace")
        value_type = reader.unpack("I")
        if wanted(key):
            metadata[key] = reader.value(value_type)
        else:
            reader.skip_value(value_type)
    return metadata, tensor_count, reader


def _check_depth(item_type: int, depth: int) -> None:
    # Read recursively: a crafted header of arrays nested thousands deep would exhaust Python's stack.
    if item_type == _ARRAY and depth + 2 > _MAX_NESTING:  # the items would be arrays at level depth + 2
        raise ValueError(f"arrays nested more than {_MAX_NESTING} deep")


class _Reader:
    """Sequential little- or big-endian reads from a buffer; running past its end raises _Truncated."""

    def __init__(self, data: mmap.mmap, endian: str, offset: int) -> None:
        self.data, self.endian, self.offset = data, endian, offset
        self._u64 = struct.Struct(endian + "Q").unpack_from

    def unpack(self, fmt: str, at: int | None = None) -> Any:
        try:
            (value,) = struct.unpack_from(self.endian + fmt, self.data, self.offset if at is None else at)
        except struct.error:
            raise _Truncated from None
        if at is None:
            self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> bytes:
        length = self.unpack("Q")
        end = self.offset + length
        if end > len(self.data):
            raise _Truncated
        text = self.data[self.offset:end]
        self.offset = end
        return text

    def value(self, value_type: int, depth: int = 0) -> Any:
        if value_type == _STRING:
            return self.string().decode("utf-8", errors="replace")
        if value_type == _ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            _check_depth(item_type, depth)
            if item_type == _STRING:
                return self._strings(count)
            if item_type in _SCALAR_FORMATS:
                dtype = np.dtype(self.endian + _SCALAR_FORMATS[item_type])
                end = self.offset + count * dtype.itemsize
                if end > len(self.data):
                    raise _Truncated
                array = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.offset).copy()
                self.offset = end
                return array
            return [self.value(item_type, depth + 1) for _ in range(count)]
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])
        raise ValueError(f"unknown value type {value_type}")

    def skip_value(self, value_type: int, depth: int = 0) -> None:
        if value_type == _ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            _check_depth(item_type, depth)
            if item_type in _SCALAR_FORMATS:
                self.offset += count * struct.calcsize(_SCALAR_FORMATS[item_type])
                if self.offset > len(self.data):
                    raise _Truncated
            elif item_type == _STRING:
                self._strings(count, keep=False)
            else:
                for _ in range(count):
                    self.skip_value(item_type, depth + 1)
        else:
            self.value(value_type)

    def _strings(self, count: int, keep: bool = True) -> list[bytes]:
        # The hot loop for 262k-token vocabularies: local names, no per-item bounds check
        # (a short slice at the end shows up in the final offset check instead).
        data, offset, read_length = self.data, self.offset, self._u64
        if count * 8 > len(data) - offset:
            raise _Truncated
        strings: list[bytes] = []
        try:
            if keep:
                append = strings.append
                for _ in range(count):
                    (length,) = read_length(data, offset)
                    offset += 8
                    append(data[offset:offset + length])
                    offset += length
            else:
                for _ in range(count):
                    offset += 8 + read_length(data, offset)[0]
        except struct.error:
            raise _Truncated from None
        if offset > len(data):
            raise _Truncated
        self.offset = offset
        return strings
