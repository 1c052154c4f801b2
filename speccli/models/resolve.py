"""From names to files: a registry name or a path to its GGUF, a pair to its two files, and `pull`.
Each source knows how to find and obtain its own files (sources.py, hub.py, chunked.py)."""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from speccli.errors import SpeccliError, UnreadableFileError, UsageError
from speccli.gguf_files import require_gguf, require_loadable_gguf
from speccli.models.config import DEFAULT_K, DEFAULT_N_GPU_LAYERS, DEFAULT_SPEC, PairEntry, Registry, unknown_name
from speccli.models.sources import describe_missing
from speccli.util.cache import expand_home
from speccli.drafting.registry import uses_draft_model
from speccli.validation import Endpoint, K


@dataclass(frozen=True)
class ResolvedPair:
    name: str | None  # None when --target and --draft were both given without a pair
    target_name: str  # a registry name, or the path as given
    draft_name: str | None
    target_path: Path
    draft_path: Path | None  # None when the draft source needs no model (--spec ngram)
    k: K
    spec: str
    target_n_gpu_layers: int
    draft_n_gpu_layers: int
    rpc: tuple[Endpoint, ...] = ()  # the pair's RPC servers for the target (models.toml `rpc`)
    remember: bool = False  # the pair's `remember`: earlier replies kept on disk (`--remember`)


class RegistryFiles:
    """The registry's models as files: what is on disk (`cached`), and getting it there (`obtain`).
    Each returns the model's files, the one llama.cpp loads first."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def cached(self, name: str) -> list[Path] | None:
        entry = self.registry.models[name]
        return entry.source.cached_files(entry, self)

    def obtain(self, name: str, *, update: bool, quiet: bool) -> list[Path]:
        entry = self.registry.models[name]
        return entry.source.obtain(entry, self, update=update, quiet=quiet)


def resolve_models(names_or_paths: Sequence[str], registry: Registry, *, fetch: bool = True, quiet: bool = False) -> list[Path]:
    """`resolve_model` for each, every name and path checked before any model is fetched or built: a
    mistyped second name, or a target file cut short, must not wait for a download of the draft."""
    for name_or_path in names_or_paths:
        if name_or_path not in registry.models:
            require_loadable_gguf(resolve_model(name_or_path, registry), weights=True)  # a path, or refused
    return [resolve_model(name_or_path, registry, fetch=fetch, quiet=quiet) for name_or_path in names_or_paths]


def resolve_model(name_or_path: str, registry: Registry, *, fetch: bool = True, quiet: bool = False) -> Path:
    """The GGUF file for a registry name or a path. With fetch, a missing model is downloaded or built
    (a cached one is used without asking the network); without, it must already be on disk."""
    if not name_or_path.strip():
        raise SpeccliError("a model name or path is empty; give a registry name or a GGUF path")
    files = RegistryFiles(registry)
    if name_or_path in registry.models:
        if fetch or not registry.models[name_or_path].source.fetched:
            return files.obtain(name_or_path, update=False, quiet=quiet)[0]
        cached = files.cached(name_or_path)
        if cached is None:
            raise SpeccliError(f"model '{name_or_path}' is not on disk yet; `speccli pull {name_or_path}` fetches it")
        return cached[0]
    path = expand_home(name_or_path, "model")
    if path.is_file():
        return path
    if os.path.lexists(path) or _looks_like_path(name_or_path):
        raise UnreadableFileError(f"{name_or_path}: {describe_missing(path)}")
    raise SpeccliError(unknown_name("model", name_or_path, registry.models, " (and no file by that name)"))


def _looks_like_path(text: str) -> bool:
    # Registry names never hold a separator; an unknown name that reads like a file was meant as one.
    return os.sep in text or "/" in text or text.startswith("~") or text.endswith(".gguf")


def resolve_pair(
    pair_name: str | None,
    target: str | None,
    draft: str | None,
    registry: Registry,
    *,
    spec: str | None = None,
    fetch: bool = True,
    quiet: bool = False,
) -> ResolvedPair:
    """The pair to run: `pair_name` (default: the registry's default_pair) with `target`/`draft`
    (registry names or paths) overriding its members, and `spec` (default: the pair's) choosing the
    draft source. A target alone, with no pair name, runs as the pair made for it where the registry
    has one (`-m qwen2.5-coder-1.5b-instruct-q4km` gets that pair's draft, not the default pair's,
    which cannot draft for it). Both overrides and no pair name: an ad-hoc pair with the defaults (auto
    K, ngram+model, full GPU offload). A draft source without a model (ngram) resolves no draft; one
    given is refused."""
    pair: PairEntry | None = None
    ad_hoc = pair_name is None and target is not None and (draft is not None or (spec is not None and not uses_draft_model(spec)))
    if not ad_hoc:
        name = registry.default_pair if pair_name is None else pair_name
        if pair_name is None and target is not None:
            name = _pair_made_for(target, registry) or name
        if name is None:
            raise SpeccliError("no pair given and no default_pair in models.toml; name a pair, or give both a target and a draft")
        if name not in registry.pairs:
            detail = " (it is a model: give it as --target or --draft)" if name in registry.models else ""
            raise SpeccliError(unknown_name("pair", name, registry.pairs, detail))
        pair = registry.pairs[name]
    spec = spec or (pair.spec if pair else DEFAULT_SPEC)
    # Only None means "not given": an empty name reaches resolve_model, which refuses it.
    target_name = pair.target if target is None else target
    if uses_draft_model(spec):
        draft_name = pair.draft if draft is None else draft
        if draft_name is None:
            raise SpeccliError(f"pair {pair.name} drafts by lookup and names no draft model; --spec {spec} needs one: give --draft")
    elif draft is not None:
        raise UsageError(f"--spec {spec} drafts without a model, but a draft model was given ({draft}); drop --draft or use --spec {spec}+model")
    else:
        draft_name = None
    paths = resolve_models([target_name, *([draft_name] if draft_name is not None else [])], registry, fetch=fetch, quiet=quiet)
    return ResolvedPair(
        name=pair.name if pair else None,
        target_name=target_name,
        draft_name=draft_name,
        target_path=paths[0],
        draft_path=paths[1] if draft_name is not None else None,
        k=pair.k if pair else DEFAULT_K,
        spec=spec,
        target_n_gpu_layers=pair.target_n_gpu_layers if pair else DEFAULT_N_GPU_LAYERS,
        draft_n_gpu_layers=pair.draft_n_gpu_layers if pair else DEFAULT_N_GPU_LAYERS,
        rpc=pair.rpc if pair else (),
        remember=pair.remember if pair else False,
    )


def _pair_made_for(target: str, registry: Registry) -> str | None:
    """The pair whose target is the registry model `target`: the default pair where it is one of
    several, else the only one; None where none is, or several are and the default pair is not."""
    names = [pair.name for pair in registry.pairs.values() if pair.target == target]
    if registry.default_pair in names:
        return registry.default_pair
    return names[0] if len(names) == 1 else None


def pull_models(registry: Registry, names: Iterable[str], *, quiet: bool = False) -> Iterator[tuple[str, Path]]:
    """Download or build each named model (a pair name stands for its target and draft), checking the
    Hugging Face Hub for a newer file at the entry's revision. Every name is checked before any work."""
    wanted: list[str] = []
    for name in names:
        # A name may be both (a model of the user's named as a bundled pair is): it stands for each.
        members = [name] if name in registry.models else []
        if name in registry.pairs:
            members += [member for member in (registry.pairs[name].target, registry.pairs[name].draft) if member]
        if not members:
            raise SpeccliError(unknown_name("model or pair", name, [*registry.models, *registry.pairs]))
        wanted.extend(member for member in members if member not in wanted)
    files = RegistryFiles(registry)
    for name in wanted:
        path = files.obtain(name, update=True, quiet=quiet)[0]
        # A file on disk is not yet a model: a path entry naming another kind of file, or a cached
        # build emptied since, must not be reported as pulled. A local file is checked as loading
        # checks it (a copy cut short); downloads and builds were checked whole as they arrived.
        try:
            if registry.models[name].source.fetched:
                require_gguf(path)
            else:
                require_loadable_gguf(path, weights=True)
        except UnreadableFileError as error:
            raise UnreadableFileError(f"model '{name}': {error}") from None
        yield name, path
