"""The exception types users see as a single line (the CLI maps them; `--debug` shows the traceback),
and the one wording of why a file cannot be read."""
from __future__ import annotations

import errno
import os
from pathlib import Path


class SpeccliError(Exception):
    """A problem the user can fix: the message names the thing and what is wrong with it."""

    exit_code = 1


class UsageError(SpeccliError):
    """A command line that cannot mean anything (options that exclude each other): exit 2, as Click's
    own usage errors."""

    exit_code = 2


class WrongTypeError(UsageError):
    """A value of the wrong type for an option speccli parses itself (`--k two`): a usage error, as
    Click's own are for typed options (`--temp abc`)."""


class StdoutError(SpeccliError):
    """stdout cannot be written (`> /dev/full`): exit 2, as a failed write to stdout is elsewhere."""

    exit_code = 2


class NonFiniteLogitsError(SpeccliError):
    """A row of logits with NaN or +infinity in it, or no finite value at all: no distribution, so no
    token can be drawn from it (a broken model file or backend). Raised where sampling finds it, which
    does not know the model; `speccli.llama.model.naming_non_finite_logits` names it."""

    def __init__(self, message: str = "a model's logits are not finite (NaN or infinity), so no token can be "
                                      "drawn from them") -> None:
        super().__init__(message)


class ReaderGoneError(SpeccliError):
    """The reader of stdout went away (`| head`) before a result it cannot be run again for cheaply was
    written (bench's --json -): exit 141, as for any command, but with a line saying where it is kept."""

    exit_code = 141


INTERRUPTED_EXIT_CODE = 130  # Ctrl-C, as shells report a process ended by SIGINT
TERMINATED_EXIT_CODE = 143  # SIGTERM, likewise


class UnreadableFileError(SpeccliError):
    """A model or config file that is missing, not readable, or not what it claims to be."""

    exit_code = 2


_REASONS = {
    errno.ENOENT: "no such file",
    errno.ELOOP: "a loop of symbolic links, not a file",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "no such file (a part of the path is not a folder)",
    errno.ENAMETOOLONG: "the name is too long",
}


def unreadable(path: Path | str, error: OSError, kind: str = "GGUF file") -> UnreadableFileError:
    """`path: reason` for a file that could not be opened or read (see `unreadable_reason`)."""
    return UnreadableFileError(f"{path}: {unreadable_reason(path, error, kind)}")


def unreadable_reason(path: Path | str, error: OSError, kind: str = "GGUF file") -> str:
    """Why `path`, meant to be a `kind`, could not be opened or read, in a few words; a dangling link
    says where it points."""
    if error.errno == errno.ENOENT and os.path.islink(path):
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    if error.errno == errno.EISDIR:
        return f"is a directory, not a {kind}"
    return _REASONS.get(error.errno or 0) or f"cannot read it ({error.strerror or error})"
