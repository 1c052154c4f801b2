"""The benchmark scripts' PAIR argument: a pair in models.toml, or TARGET.gguf,DRAFT.gguf (any pair of
files, such as the device check's, which the registry does not know)."""
from __future__ import annotations

from speccli.models.config import load_registry
from speccli.models.resolve import ResolvedPair, resolve_pair

HELP = "a pair in models.toml, or TARGET.gguf,DRAFT.gguf"


def pair_files(pair: str) -> ResolvedPair:
    target, _, draft = pair.partition(",")
    if draft:
        return resolve_pair(None, target, draft, load_registry(), quiet=True)
    return resolve_pair(pair, None, None, load_registry(), quiet=True)
