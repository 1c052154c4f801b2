"""The stores of earlier replies kept in files (`--remember`), and what `speccli remembered` lists.

A store (speccli/drafting/suffix.py) is made for one process; `open_store` gives chat and serve the one
in speccli's cache for their target's vocabulary. One process writes a store, the one holding its owner
lock; another drafts from what the file held and keeps its own replies in memory (docs/cli.md#caches).
A file is written whole or not at all, readable by the user alone; one that is not a store of this
vocabulary is never read as one (it could only draft wrong tokens).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Sequence

import numpy as np

from speccli.drafting.suffix import DEFAULT_CAP_TOKENS, SEPARATOR, SuffixStore
from speccli.util.cache import speccli_cache_dir
from speccli.util.files import (
    PARTIAL_SUFFIX, abandoned, open_regular, partial_path, private_folder, remove_abandoned_partials, try_lock,
)
from speccli.util.format import one_line

if TYPE_CHECKING:
    from speccli.llama.tokenizer import Tokenizer

FORMAT = 1
MAX_HEADER_BYTES = 4096  # a header is a few hundred bytes at most; a length past this is not a store
MAX_MODEL_NAME = 256  # characters of the target's name kept in the header (at most 12 bytes each, escaped)
SAVE_EVERY_SECONDS = 10  # a remembered store is written after a reply at most this often, and on exit
OWNER_WAIT_SECONDS = 1.0  # how long a process opening a store waits for its lock before keeping replies in memory


class RememberedStore(SuffixStore):
    """A store with a file: written after a reply (at most every SAVE_EVERY_SECONDS) and at the end, by
    the process holding its lock (`path` None: drafted from, written by another or not at all)."""

    def __init__(self, cap_tokens: int = DEFAULT_CAP_TOKENS, vocabulary: str = "") -> None:
        self.vocabulary = vocabulary  # a fingerprint of the target's vocabulary (`vocabulary_fingerprint`)
        self.path: Path | None = None  # where it is written
        self.model = ""  # the target's file name, for `speccli remembered`
        self.warn: Callable[[str], None] = lambda line: None  # where a file it cannot write is said
        self._saved_at = 0.0
        self._lock = None  # the owner lock (`open_store`), held while this process writes the file
        super().__init__(cap_tokens)

    def clear(self) -> None:
        super().clear()
        self._unsaved = True

    def extend(self, tokens: Sequence[int]) -> None:
        super().extend(tokens)
        self._unsaved = True

    def persist(self, now: bool = False) -> None:
        """Write it to its file, if it has one and changed: `now`, or where it was not written lately. A
        file it cannot write (a full disk, a read-only cache) is said once, and the store kept in memory."""
        if self.path is not None and self._unsaved and (now or time.monotonic() - self._saved_at >= SAVE_EVERY_SECONDS):
            try:
                self.save(self.path)
            except OSError as error:
                self.warn(f"warning: {self.path}: cannot be written ({error.strerror or error}); "
                          "earlier replies are kept for this process only")
                self.path = None
                return
            self._unsaved, self._saved_at = False, time.monotonic()

    def close(self) -> None:
        """Written now, and given up: the process that opens this store next may write it."""
        self.persist(now=True)
        if self._lock is not None:
            self._lock.close()
            self._lock, self.path = None, None

    def save(self, path: Path) -> None:
        """Written whole or not at all, readable by the user alone: it holds the user's replies."""
        private_folder(path.parent)
        remove_abandoned_partials(path)
        partial = partial_path(path)
        # The model's name only labels the listing: cut, so that any name keeps the header readable
        # (escaped as ASCII: a file name may hold bytes that are not UTF-8).
        model = self.model[:MAX_MODEL_NAME]
        header = json.dumps({"format": FORMAT, "vocabulary": self.vocabulary, "model": model}).encode()
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(len(header).to_bytes(4, "little") + header)
                file.write(self._tokens.tobytes())
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path, vocabulary: str, n_vocab: int, cap_tokens: int) -> tuple[RememberedStore, str | None]:
        """The store in `path` (its newest `cap_tokens`), or a fresh one and why (a file that is not a
        store of this vocabulary is never read as one: it could only draft wrong tokens)."""
        store = cls(cap_tokens, vocabulary)
        try:
            with open_regular(path) as file:
                header = _read_header(file)
                body_bytes = os.fstat(file.fileno()).st_size - file.tell()
                problem = _problem(header, vocabulary)
                if problem is None:
                    # A file cut short mid-token (a copy, a full disk) keeps the whole tokens before the cut.
                    kept = min(body_bytes // 4, cap_tokens)
                    file.seek(file.tell() + 4 * (body_bytes // 4 - kept))
                    tokens = np.frombuffer(file.read(4 * kept), dtype=np.int32)
                    if len(tokens) and (tokens.min() < SEPARATOR or tokens.max() >= n_vocab):
                        problem = "holds token ids outside this vocabulary"
        except FileNotFoundError:
            return store, None
        except OSError as error:
            return store, f"{path}: unreadable ({error.strerror}); starting a new store"
        if problem is not None:
            return store, f"{path}: {problem}; starting a new store"
        store._load_tokens(tokens)
        if body_bytes // 4 > cap_tokens:
            store._evict()
        if body_bytes % 4:
            return store, f"{path}: cut short mid-token; keeping the {body_bytes // 4:,} whole tokens before the cut"
        return store, None


def _read_header(file: BinaryIO) -> dict | None:
    """A store's header (its length in 4 bytes, then JSON), or None where the file starts otherwise."""
    size = int.from_bytes(file.read(4), "little")
    if size > MAX_HEADER_BYTES:
        return None
    try:
        header = json.loads(file.read(size))
    except (ValueError, UnicodeDecodeError):
        return None
    return header if isinstance(header, dict) else None


def _problem(header: dict | None, vocabulary: str) -> str | None:
    if header is None:
        return "not a speccli store"
    if header.get("format") != FORMAT:
        return "not a speccli store of this version"
    if header.get("vocabulary") != vocabulary:
        return "a store of another vocabulary"
    return None


def stores_dir() -> Path:
    return speccli_cache_dir() / "remembered"


def open_store(tokenizer: Tokenizer, model: str, remember: bool, warn: Callable[[str], None]) -> SuffixStore:
    """A store of earlier replies for this target: a new one, or with `remember`, the one in speccli's
    cache for its vocabulary (a file that cannot serve is said in one line and replaced)."""
    if not remember:
        return SuffixStore()
    fingerprint = vocabulary_fingerprint(tokenizer)
    path = stores_dir() / f"{fingerprint}.suffix"
    # One process writes a store: the one holding its lock. Another drafts from what it holds on disk
    # and keeps its own replies in memory, so neither overwrites the other's (docs/cli.md#caches).
    try:
        private_folder(path.parent)
    except OSError:
        pass  # a read-only cache: said where the lock cannot be made
    try:
        lock, holder = _owner_lock_of(path)
    except OSError as error:
        lock, holder = None, None
        warn(f"warning: {owner_lock(path)}: cannot be used as the lock of {path.name} ({error.strerror or error}); "
             "earlier replies are kept for this process only")
    store, problem = RememberedStore.load(path, fingerprint, tokenizer.n_vocab, DEFAULT_CAP_TOKENS)
    if problem is not None:
        warn(f"warning: {problem}")
    if holder is not None:
        warn(f"warning: {path}: in use by another speccli process{f' (pid {holder})' if holder else ''}; this one "
             "drafts from it too but keeps its own replies in memory only")
    store.model, store.warn = model, warn
    if lock is not None:
        store.path, store._lock = path, lock
    return store


def _owner_lock_of(path: Path) -> tuple[BinaryIO | None, int | None]:
    """`try_lock` on the store's owner lock, tried for OWNER_WAIT_SECONDS: `speccli remembered` holds it
    for a moment to list or clear the store."""
    deadline = time.monotonic() + OWNER_WAIT_SECONDS
    while True:
        lock, holder = try_lock(owner_lock(path))
        if lock is not None or time.monotonic() >= deadline:
            return lock, holder
        time.sleep(0.05)


def owner_lock(path: Path) -> Path:
    """The lock the process writing the store at `path` holds for its life (in the cache's locks/, so a
    cleared remembered/ is empty)."""
    return speccli_cache_dir() / "locks" / f"{path.name}.owner"


def store_files() -> list[Path]:
    return sorted(stores_dir().glob("*.suffix"))


def stores_owned() -> list[Path]:
    """The stores whose owner lock exists (`owner_lock`): a running process may hold replies in memory
    for one that has no file yet."""
    return [stores_dir() / lock.name.removesuffix(".owner") for lock in (speccli_cache_dir() / "locks").glob("*.suffix.owner")]


def holder_of(path: Path) -> int | None:
    """The pid of the process writing the store at `path` (0 where it has not said), None where none does."""
    if not owner_lock(path).exists():
        return None
    try:
        lock, holder = try_lock(owner_lock(path), say_pid=False)
    except OSError:
        return None
    if lock is not None:
        lock.close()
    return holder


def killed_saves() -> list[Path]:
    """Temporary files of saves (a store's, a policy file's) whose process was killed mid-write: a
    store's holds replies too."""
    return sorted(partial for partial in stores_dir().glob(f"*{PARTIAL_SUFFIX}") if abandoned(partial))


def describe_stores() -> list[dict[str, object]]:
    """What `speccli remembered` lists: each store file, its target and size (an entry that cannot be
    read, such as a directory of that name, is listed as such)."""
    described = []
    for path in store_files():
        try:
            with open_regular(path) as file:
                header = _read_header(file)
                length = os.fstat(file.fileno()).st_size
                body_bytes = length - file.tell()
        except OSError as error:
            described.append({"file": path, "model": f"? (unreadable: {error.strerror or error})", "tokens": None, "bytes": None})
            continue
        model = header.get("model") if header is not None and header.get("format") == FORMAT else None
        if not isinstance(model, str):
            described.append({"file": path, "model": "? (not a store)", "tokens": None, "bytes": length})
            continue
        # A file name may hold a newline or an escape sequence; a listing line must stay one line.
        model = one_line(model) + (" (cut short mid-token)" if body_bytes % 4 else "")
        described.append({"file": path, "model": model, "tokens": body_bytes // 4, "bytes": length, "holder": holder_of(path)})
    for path in sorted(set(stores_owned()) - set(store_files())):
        if holder := holder_of(path):  # replies in a running process's memory, not yet saved
            described.append({"file": path, "model": "(no file yet)", "tokens": None, "bytes": None, "holder": holder})
    for path in killed_saves():
        what = "holds replies" if ".suffix." in path.name else "what auto learnt"
        described.append({"file": path, "model": f"(left by a save that was killed; {what})", "tokens": None,
                          "bytes": path.stat().st_size if path.exists() else 0})
    return described


def vocabulary_fingerprint(tokenizer: Tokenizer) -> str:
    """What a store file is keyed by: the target's token texts, in order."""
    digest = hashlib.sha256()
    for token in range(tokenizer.n_vocab):
        digest.update(tokenizer.token_bytes(token, special=True) + b"\0")
    return digest.hexdigest()[:32]
