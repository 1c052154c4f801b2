"""sha256 of files, and a record of digests already computed, for large files that would be slow to hash on every use."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from speccli.errors import SpeccliError
from speccli.util.cache import speccli_cache_dir

_BLOCK = 8 << 20


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as stream:
        while block := stream.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _record_file() -> Path:
    return speccli_cache_dir() / "file-sha256.json"


def _identity(file: Path) -> str:
    # A file replaced or rewritten in place changes size or mtime (or, for a new blob, its path).
    resolved = file.resolve()
    status = resolved.stat()
    return f"{resolved}|{status.st_size}|{status.st_mtime_ns}"


def cached_sha256(file: Path) -> str:
    """sha256 of `file`, remembered by its identity (resolved path, size, mtime), so a 1 GB model is
    hashed once rather than on every use: in a record in the cache, and for the process (where the
    record cannot be written, a read-only cache, a run hashes a file once and the next run again)."""
    identity = _identity(file)
    if identity in _digests:
        return _digests[identity]
    record = _read_record()
    known = record.get(identity)
    if isinstance(known, str):
        _digests[identity] = known
        return known
    digest = _digests[identity] = sha256_of(file)
    record[identity] = digest
    _write_record(record)
    return digest


_digests: dict[str, str] = {}


def _read_record() -> dict[str, object]:
    try:
        record = json.loads(_record_file().read_text(encoding="utf-8"))
    except (OSError, ValueError, SpeccliError):  # none, unreadable, or no cache folder at all: hash again
        return {}
    return record if isinstance(record, dict) else {}


def _write_record(record: dict[str, object]) -> None:
    try:
        record_file = _record_file()
    except SpeccliError:  # no cache folder (an empty HOME): nothing to remember the digest in
        return
    temporary = record_file.with_name(f"{record_file.name}.{os.getpid()}.tmp")
    try:
        record_file.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(record, indent=0), encoding="utf-8")
        temporary.replace(record_file)
    except OSError:  # only a cache (a read-only one included): the next run hashes again
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
