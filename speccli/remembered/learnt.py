"""What `--k auto` learnt about a pair, kept between processes: a one-shot `chat -p` or the first request
after a `serve` restart drafts as the last process left off, not from the priors.

One small JSON file per pair, sampling regime (greedy or sampled) and machine, in speccli's cache beside
the stores of earlier replies (`speccli remembered` lists both, `--clear` deletes both). It holds the
policy's estimates (acceptance by source and kind of match, each key's schedule and drafting cost) and
the pair's cost profile as timed (so a process does not time it again before its first reply), no text.
A file that cannot serve (damaged, another format, foreign) is one warning line and a fresh start; a
file that cannot be written is said once.
`SPECCLI_COLD_START=1` turns it off (neither read nor written): `auto` then starts from its priors in
every process, whatever earlier runs left (tests/conftest.py sets it).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from speccli.core.sampling import SamplingParams
from speccli.core.seam import CostProfile, DraftCosts
from speccli.drafting.acceptance import MEMORY, Acceptance
from speccli.drafting.costs import DraftCost
from speccli.drafting.policy import AutoK, KeyState, LookupSchedule, ModelSchedule
from speccli.errors import SpeccliError
from speccli.remembered.stores import SAVE_EVERY_SECONDS, stores_dir
from speccli.util.cache import speccli_cache_dir
from speccli.util.files import build_atomically, open_regular, private_folder
from speccli.util.format import one_line

if TYPE_CHECKING:
    from speccli.core.generator import PairCosts
    from speccli.llama.model import Model

FORMAT = 2
MAX_BYTES = 4 * 2**20  # a policy's state is a few KB; a file past this is not one
COLD_START = "SPECCLI_COLD_START"


def learnt_path(target: Model, draft: Model | None, sampling: SamplingParams) -> Path:
    """Where the state of `auto` for this pair, regime and machine is kept."""
    identity = json.dumps({
        "target": _file_identity(target.path), "draft": draft and _file_identity(draft.path),
        "placement": [target.placement, draft and draft.placement],
        # serve's slots share each decode: what a draft costs there is not what it costs alone
        **({"slots": target.n_seq} if target.n_seq > 1 else {}),
        **({"threads": target.options.n_threads} if target.options.n_threads else {}),  # None: every core
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
        self.pair = target.name + (f" + {draft.name}" if draft is not None else "")  # as the user named them
        # what else tells two files of one pair apart (`learnt_path`), for `speccli remembered` to say
        self.setup = ", ".join([target.placement, f"{target.options.n_threads} threads" if target.options.n_threads
                                else "every core", *([f"{target.n_seq} slots"] if target.n_seq > 1 else [])])
        self.active = os.environ.get(COLD_START, "0") in ("", "0")  # off: cold starts, or a file it cannot write
        self._kept_at = time.monotonic()
        self._started_ns = time.time_ns()

    def recall(self, policy: object, sampling: SamplingParams, costs: PairCosts | None = None) -> None:
        """Give `policy` what the file holds, and `costs` the profile timed with it (with the draft
        model's costs where one is loaded), so that the first reply neither starts from the priors
        nor waits for a profile."""
        if isinstance(policy, AutoK) and self.active:
            problem = _read_into(policy, learnt_path(self.target, self.draft, sampling), costs, self.draft is not None)
            if problem is not None:
                self.warn(problem)

    def keep(self, policy: object, sampling: SamplingParams, now: bool = False, costs: PairCosts | None = None) -> None:
        if not (isinstance(policy, AutoK) and self.active and (now or time.monotonic() - self._kept_at >= SAVE_EVERY_SECONDS)):
            return
        if _cleared_since(self._started_ns):  # what it learnt before `remembered --clear` is never written back
            self.active = False
            return
        path = learnt_path(self.target, self.draft, sampling)
        profile = {} if costs is None or costs.measured is None else {"costs": costs_state(costs.measured, costs.asked)}
        text = json.dumps({"format": FORMAT, "pair": self.pair, "regime": regime(sampling), "setup": self.setup,
                           "learnt": policy_state(policy),
                           **profile})
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


def _read_into(policy: AutoK, path: Path, costs: PairCosts | None, with_draft: bool) -> str | None:
    """Give `policy` what the file at `path` holds, and `costs` its profile (one with draft costs
    `with_draft`); a line saying why not where it cannot serve (none where there is no file yet)."""
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
        profile = recall_costs(saved["costs"]) if "costs" in saved else None
        recall_state(policy, saved["learnt"])
    except (ValueError, KeyError, TypeError) as error:
        why = error if isinstance(error, ValueError) else f"damaged ({type(error).__name__}: {error})"
        return f"warning: {path}: {why}; `auto` starts from its priors"
    if costs is not None and profile is not None and (bool(profile[0].draft_costs) or not with_draft):
        costs.remember(*profile)
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
        label = f"{saved['pair']} ({', '.join([saved['regime'], *([saved['setup']] if 'setup' in saved else [])])})"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "? (not a policy file)"
    return one_line(f"what auto learnt: {label}")


def policy_state(policy: AutoK) -> dict[str, object]:
    """What carries to another process: each key's acceptance, schedule and drafting cost, and the
    replies' lengths (the verify curve comes from the profile, `costs_state`)."""
    return {
        "keys": {key: {"model": isinstance(state.schedule, ModelSchedule), "schedule": vars(state.schedule),
                       "acceptance": vars(state.acceptance), "cost": vars(state.cost)}
                 for key, state in policy.keys.items()},
        "reply_lengths": policy.reply_lengths, "reply_tokens": policy.reply_tokens,
    }


def recall_state(policy: AutoK, learnt: dict[str, object]) -> None:
    """Give `policy` what `policy_state` gave (another process's, read back from JSON); ValueError where
    it is not that."""
    try:
        keys = {}
        for key, state in learnt["keys"].items():
            schedule = ModelSchedule() if state["model"] is True else LookupSchedule()
            parts = (schedule, Acceptance(), DraftCost())
            for part, values in zip(parts, (state["schedule"], state["acceptance"], state["cost"])):
                _restore(part, values)
            keys[str(key)] = KeyState(*parts)
        lengths, tokens = learnt["reply_lengths"], learnt["reply_tokens"]
        if not all(type(n) is int and n >= 0 for n in [*lengths, tokens]):
            raise ValueError("reply lengths are not counts")
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"not a policy's learnt state ({type(error).__name__}: {error})") from None
    policy.keys, policy.reply_lengths, policy.reply_tokens = keys, list(lengths)[-MEMORY:], tokens
    if policy.verify.decode_seconds:
        policy.price_ramps()


def costs_state(profile: CostProfile, asked: list[int]) -> dict[str, object]:
    """The pair's cost profile as JSON (sizes as [n, seconds] pairs), with the sizes it was asked for."""
    return {"decode_seconds": sorted(profile.decode_seconds.items()), "sample_seconds": profile.sample_seconds,
            "draft_costs": {key: {"token_seconds": draft.token_seconds, "catch_up_seconds": sorted(draft.catch_up_seconds.items())}
                            for key, draft in profile.draft_costs.items()},
            "asked": asked}


def recall_costs(saved: object) -> tuple[CostProfile, list[int]]:
    """What `costs_state` gave, read back from JSON; ValueError where it is not that."""
    def seconds(value: object) -> float:
        if not _number(value, float):
            raise ValueError(f"{value!r} is not seconds")
        return float(value)

    def by_size(pairs: object) -> dict[int, float]:
        if not isinstance(pairs, list) or not all(isinstance(pair, list) and len(pair) == 2 and _number(pair[0], int)
                                                  and pair[0] > 0 for pair in pairs):
            raise ValueError(f"{pairs!r} is not timings by size")
        return {n: seconds(value) for n, value in pairs}

    try:
        decode = by_size(saved["decode_seconds"])
        if 1 not in decode:
            raise ValueError("the profile has no one-row decode")
        drafts = {str(key): DraftCosts(seconds(draft["token_seconds"]), by_size(draft["catch_up_seconds"]))
                  for key, draft in saved["draft_costs"].items()}
        asked = [n for n in saved["asked"] if _number(n, int) and n > 0]
        return CostProfile(decode, drafts, seconds(saved["sample_seconds"])), asked
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"not a cost profile ({type(error).__name__}: {error})") from None


def _number(value: object, kind: type) -> bool:
    """Is `value` (read back from JSON) a finite, non-negative number of this kind (a float may be written
    as an int; a bool is neither)?"""
    return type(value) in ((int, float) if kind is float else (kind,)) and math.isfinite(value) and value >= 0


def _restore(part: object, values: dict[str, object]) -> None:
    """Set the dataclass `part`'s fields from `values` (read back from JSON), each as its annotation says
    (every number here is a count, a rate or seconds: finite, not negative); ValueError for a field it
    lacks or a value of another kind."""
    kinds = {field.name: str(field.type) for field in fields(part)}
    if set(values) - set(kinds):
        raise ValueError(f"unknown fields {sorted(set(values) - set(kinds))}")

    for name, value in values.items():
        kind = kinds[name]
        if value is None and "None" in kind:
            pass
        elif kind.startswith("list"):
            if not isinstance(value, list) or not all(_number(v, float) for v in value):
                raise ValueError(f"{name} is not a list of counts")
            value = [float(v) for v in value]
        elif kind == "bool":
            if type(value) is not bool:
                raise ValueError(f"{name} is {value!r}")
        elif not _number(value, float if "float" in kind else int):
            raise ValueError(f"{name} is {value!r}")
        elif "float" in kind:
            value = float(value)
        setattr(part, name, value)
