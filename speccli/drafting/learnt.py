"""What `--k auto` learnt about a pair, kept between processes: a one-shot `chat -p` or the first request
after a `serve` restart drafts as the last process left off, not from the priors.

One small JSON file per pair, sampling regime (greedy or sampled) and machine, in speccli's cache beside
the stores of earlier replies (`speccli remembered` lists both, `--clear` deletes both). It holds the
policy's estimates (acceptance by source and kind of match, each key's schedule and drafting cost), no
text. The verify curve is profiled again by each process. A file that cannot serve (damaged, another
format, foreign) is one warning line and a fresh start; a file that cannot be written is said once.
`SPECCLI_COLD_START=1` turns it off (neither read nor written): `auto` then starts from its priors in
every process, whatever earlier runs left (tests/conftest.py sets it).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from speccli.core.sampling import SamplingParams
from speccli.drafting.suffix import SAVE_EVERY_SECONDS, stores_dir
from speccli.errors import SpeccliError
from speccli.util.cache import speccli_cache_dir
from speccli.util.files import build_atomically, open_regular, private_folder
from speccli.util.format import one_line

if TYPE_CHECKING:
    from speccli.llama.model import Model

FORMAT = 1
MAX_BYTES = 4 * 2**20  # a policy's state is a few KB; a file past this is not one
COLD_START = "SPECCLI_COLD_START"


def learnt_path(target: Model, draft: Model | None, sampling: SamplingParams) -> Path:
    """Where the state of `auto` for this pair, regime and machine is kept."""
    identity = json.dumps({
        "target": _file_identity(target.path), "draft": draft and _file_identity(draft.path),
        "placement": [target.placement, draft and draft.placement],
        # serve's slots share each decode: what a draft costs there is not what it costs alone
        **({"slots": target.n_seq} if target.n_seq > 1 else {}),
        "regime": regime(sampling), "machine": [platform.node(), platform.machine(), os.cpu_count()],
    }, sort_keys=True)
    return stores_dir() / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.policy"


def regime(sampling: SamplingParams) -> str:
    return "greedy" if sampling.greedy else "sampled"


def _file_identity(path: Path) -> list[object]:
    try:
        return [path.name, path.stat().st_size]
    except OSError:
        return [path.name, None]


class LearntFile:
    """The file of one pair's `auto` state: recalled when a policy starts, kept after a reply (at most
    every SAVE_EVERY_SECONDS) and at the end. A fixed K learns nothing: it is neither read nor written."""

    def __init__(self, target: Model, draft: Model | None, warn: Callable[[str], None]) -> None:
        self.target, self.draft, self.warn = target, draft, warn
        self.pair = target.path.name + (f" + {draft.path.name}" if draft is not None else "")
        self.active = os.environ.get(COLD_START, "0") in ("", "0")  # off: cold starts, or a file it cannot write
        self._kept_at = time.monotonic()
        self._started_ns = time.time_ns()

    def recall(self, policy: object, sampling: SamplingParams) -> None:
        if hasattr(policy, "recall") and self.active:
            problem = _read_into(policy, learnt_path(self.target, self.draft, sampling))
            if problem is not None:
                self.warn(problem)

    def keep(self, policy: object, sampling: SamplingParams, now: bool = False) -> None:
        if not (hasattr(policy, "learnt") and self.active and (now or time.monotonic() - self._kept_at >= SAVE_EVERY_SECONDS)):
            return
        if _cleared_since(self._started_ns):  # what it learnt before `remembered --clear` is never written back
            self.active = False
            return
        path = learnt_path(self.target, self.draft, sampling)
        text = json.dumps({"format": FORMAT, "pair": self.pair, "regime": regime(sampling), "learnt": policy.learnt()})
        try:
            private_folder(path.parent)
            build_atomically(path, lambda partial: partial.write_text(text))
        except (OSError, SpeccliError) as error:
            self.warn(f"warning: {path}: cannot be written ({getattr(error, 'strerror', None) or error}); what "
                      "`auto` learnt is kept for this process only")
            self.active = False
        self._kept_at = time.monotonic()


def cleared_marker() -> Path:
    """Touched by `speccli remembered --clear`: a process started before then writes no policy file again."""
    return speccli_cache_dir() / "locks" / "remembered.cleared"


def _cleared_since(started_ns: int) -> bool:
    try:
        return cleared_marker().stat().st_mtime_ns >= started_ns
    except OSError:
        return False


def _read_into(policy: object, path: Path) -> str | None:
    """Give `policy` what the file at `path` holds; a line saying why not where it cannot serve (none
    where there is no file yet)."""
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"warning: {path}: unreadable ({error.strerror or error}); `auto` starts from its priors"
    try:
        saved = json.loads(data) if len(data) <= MAX_BYTES else None
    except (ValueError, RecursionError):  # a UnicodeDecodeError is a ValueError too
        saved = None
    if saved is None:
        return f"warning: {path}: damaged (not a policy file's JSON); `auto` starts from its priors"
    try:
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise ValueError("not a speccli policy file of this version")
        policy.recall(saved["learnt"])
    except (ValueError, KeyError, TypeError) as error:
        why = error if isinstance(error, ValueError) else f"damaged ({type(error).__name__}: {error})"
        return f"warning: {path}: {why}; `auto` starts from its priors"
    return None


def _read_regular(path: Path) -> bytes:
    """Up to MAX_BYTES + 1 bytes of `path`, if it is a regular file (`open_regular`)."""
    with open_regular(path) as file:
        return file.read(MAX_BYTES + 1)


def learnt_files() -> list[Path]:
    return sorted(stores_dir().glob("*.policy"))


def describe(path: Path) -> str:
    """What `speccli remembered` says of a policy file: its pair and regime."""
    try:
        saved = json.loads(_read_regular(path))
        label = f"{saved['pair']} ({saved['regime']})"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "? (not a policy file)"
    return one_line(f"what auto learnt: {label}")
