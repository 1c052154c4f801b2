"""Files that only ever appear complete: written under a temporary name beside the destination,
flushed to disk, then renamed over it; clearing the temporary files of builds that were killed; and
a lock so that concurrent runs build a file once. And text input (prompts, a text, a report) read
with a bound."""
from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; concurrent builds then only cost time
    fcntl = None

from speccli.errors import SpeccliError
from speccli.util.cache import speccli_cache_dir

PARTIAL_SUFFIX = ".partial"


# The most any text input is read (prompts, a text, a bench report): far more than a context holds, and
# a device (/dev/zero) or a wrong file named by mistake must not fill memory.
MAX_TEXT_INPUT_BYTES = 16 * 2**20


def read_text_input(path: Path, name: str) -> bytes:
    """The bytes of `path`, refused past MAX_TEXT_INPUT_BYTES with one line starting with `name`.
    OSError is the caller's to word."""
    with path.open("rb") as file:
        data = file.read(MAX_TEXT_INPUT_BYTES + 1)
    if len(data) > MAX_TEXT_INPUT_BYTES:
        raise SpeccliError(f"{name}: more than {MAX_TEXT_INPUT_BYTES // 2**20} MiB; speccli reads no text input that large")
    return data


def partial_path(dest: Path) -> Path:
    """This process's temporary name for `dest`; the pid tells a live build's file from an abandoned one."""
    return dest.with_name(f"{dest.name}.{os.getpid()}{PARTIAL_SUFFIX}")


def build_atomically(dest: Path, write: Callable[[Path], object], *, check: Callable[[Path], None] | None = None) -> Path:
    """Call write(partial) on a temporary path beside `dest`, optionally check(partial), then fsync it
    and rename it to `dest` (and fsync the folder, so the rename survives a power cut). A build that
    fails, is refused by `check`, or is killed never leaves a file at `dest`: the next run builds again."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir():  # found now, not after the build, through the temporary file's name
        raise SpeccliError(f"{dest}: a folder is where speccli puts this built file; remove it")
    remove_abandoned_partials(dest)
    partial = partial_path(dest)
    try:
        write(partial)
        if not partial.is_file():
            raise SpeccliError(f"building {dest} produced no file")
        if check is not None:
            check(partial)
        fsync_file(partial)
        os.replace(partial, dest)
        fsync_directory(dest.parent)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return dest


def fsync_file(path: Path) -> None:
    with path.open("rb") as stream:
        os.fsync(stream.fileno())


def fsync_directory(directory: Path) -> None:
    if os.name == "nt":
        return  # directories cannot be opened for fsync on Windows; NTFS journals the rename
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def remove_abandoned_partials(dest: Path) -> None:
    """Temporary files of builds of `dest` whose process is gone (killed mid-write); a live build's is kept."""
    for partial in dest.parent.glob(f"{dest.name}.*{PARTIAL_SUFFIX}"):
        if abandoned(partial, allow_own=True):
            partial.unlink(missing_ok=True)


def abandoned(partial: Path, allow_own: bool = False) -> bool:
    """Whether `partial` (NAME.PID.partial) is a temporary file whose process is gone (or this process's,
    where `allow_own`: one it left itself)."""
    pid = partial.name.removesuffix(PARTIAL_SUFFIX).rpartition(".")[2]
    if not (pid.isascii() and pid.isdigit()):
        return False  # not named as speccli names them: not speccli's to delete
    return (allow_own and int(pid) == os.getpid()) or not process_alive(int(pid))


def process_alive(pid: int) -> bool:
    if os.name == "nt":
        return True  # os.kill(pid, 0) would terminate it on Windows; keep the file
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # past any pid: no such process
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def build_once(dest: Path, done: Callable[[], bool], build: Callable[[], object]) -> bool:
    """Run `build` unless `done()` says `dest` is built: asked first without the lock (reading a finished
    build needs none, and a cache on a read-only mount could not create one), then again under
    `build_lock`, where a run this one waited for may have built it. Returns whether this run built it."""
    if done():
        return False
    with build_lock(dest):
        if done():
            return False
        build()
        return True


@contextmanager
def build_lock(dest: Path) -> Iterator[None]:
    """Held while `dest` is built, so that two runs started together build it once: the second
    waits, then finds the file. (An advisory lock; released by the OS if the holder dies.)"""
    # Kept apart from the builds, so a model's folder holds only its files; named by the destination.
    cache = speccli_cache_dir()
    lock_file = cache / "locks" / f"{hashlib.sha256(str(dest.resolve()).encode()).hexdigest()[:24]}.lock"
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        handle = lock_file.open("a")
    except OSError as error:  # the lock file is speccli's own: the cache is what the user can act on
        raise SpeccliError(
            f"cannot build {dest}: speccli's cache at {cache} cannot be written ({error.strerror or error}); "
            "make it writable or point SPECCLI_CACHE_DIR elsewhere"
        ) from None
    with handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading, if it is a regular file: a FIFO named like a cache file would block the
    read, a link to /dev/zero never end it (IsADirectoryError for a folder, else OSError "not a regular
    file"). The descriptor is checked before a file object owns it, and closed where it is refused."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        raise OSError(0, "not a regular file", str(path))
    return open(descriptor, "rb")


def private_folder(folder: Path) -> Path:
    """`folder`, made if missing, readable by the user alone (0700): what is kept there names the user's
    models and holds their replies. One made by an earlier version (0755) is narrowed if it is ours."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_mode & 0o077 and info.st_uid == os.getuid():
        folder.chmod(0o700)
    return folder


def try_lock(lock_file: Path, say_pid: bool = True) -> tuple[BinaryIO | None, int | None]:
    """An exclusive advisory lock on `lock_file`, without waiting: (the open file, None), the lock held
    until that file is closed or the process ends (the OS releases it if the process dies), the pid
    written in it where `say_pid`; or (None, the holder's pid, 0 where it has not said) where another
    process holds it. OSError where the lock file cannot be made."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    handle = lock_file.open("a+b")
    if fcntl is None:
        return handle, None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        said = handle.read(32).strip()  # bytes: isdigit() is ASCII digits only
        handle.close()
        return None, int(said) if said.isdigit() else 0
    if say_pid:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()).encode())
        handle.flush()
    return handle, None
