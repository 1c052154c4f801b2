"""models.toml: its schema, and merging the files that make up the registry.

Read in order, a later file replacing earlier entries of the same name as a whole: the shipped
models.toml, ${XDG_CONFIG_HOME:-~/.config}/speccli/models.toml, then an explicit --config file.
References (a pair's models, a derived model's base, default_pair) are checked after merging, since
a user's pair may name a shipped model and the other way round.
"""
from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from speccli.errors import SpeccliError, UnreadableFileError, unreadable
from speccli.models.chunked import ChunkedPackagesSource
from speccli.models.hub import HubSource
from speccli.models.schema import TomlTable, key_path, one_of
from speccli.models.sources import DerivedSource, LocalSource, ModelSource, PackageSource
from speccli.util.cache import expand_home, user_config_path
from speccli.util.files import read_text_input
from speccli.drafting.registry import DEFAULT_SPEC
from speccli.drafting.registry import uses_draft_model
from speccli.validation import AUTO_K, Endpoint, K

DEFAULT_K: K = AUTO_K  # K chosen per step from measured costs
# llama.cpp's n_gpu_layers: -1 offloads every layer where the backend can; CPU-only builds ignore it.
DEFAULT_N_GPU_LAYERS = -1

# Every kind of model source, by the models.toml key that selects it.
SOURCE_KINDS: dict[str, type[ModelSource]] = {
    kind.key: kind for kind in (LocalSource, HubSource, PackageSource, ChunkedPackagesSource, DerivedSource)
}
_PAIR_KEYS = ("target", "draft", "k", "spec", "target_n_gpu_layers", "draft_n_gpu_layers", "rpc", "remember")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A name is a folder in speccli's cache (derived builds): well within a file name's 255 bytes.
MAX_NAME_LENGTH = 100
_TOML_ERROR_POSITION = re.compile(r"\(at line (?P<line>\d+), column (?P<column>\d+)\)$")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: ModelSource
    defined_in: Path


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    draft: str | None  # None: the pair drafts by lookup only (spec = "ngram"), with no draft model
    k: K
    spec: str
    target_n_gpu_layers: int
    draft_n_gpu_layers: int
    defined_in: Path
    rpc: tuple[Endpoint, ...] = ()  # RPC servers for the target: "host:port,host:port"
    remember: bool = False  # keep earlier replies on disk for the suffix source (`--remember`)


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    default_pair: str | None
    files: tuple[Path, ...]  # the configuration files read, in order


def load_registry(*extra_configs: Path) -> Registry:
    """The shipped registry, overridden per entry by the user's file and then by each of
    `extra_configs` in turn (`--config`, as often as given)."""
    shipped = resources.files("speccli.data") / "models.toml"
    with resources.as_file(shipped) as shipped_path:
        layers = [_read_layer(Path(shipped_path))]
    user_file = user_config_path()
    if os.path.lexists(user_file):  # a link to nothing is a mistake to report, not a file to skip
        layers.append(_read_layer(user_file))
    layers += [_read_layer(expand_home(extra, "--config")) for extra in extra_configs]

    models: dict[str, ModelEntry] = {}
    pairs: dict[str, PairEntry] = {}
    default_pair: tuple[str, Path] | None = None
    for layer in layers:
        models.update(layer.models)
        pairs.update(layer.pairs)
        if layer.default_pair is not None:
            default_pair = (layer.default_pair, layer.file)
    _check_references(models, pairs, default_pair)
    return Registry(
        models=models,
        pairs=pairs,
        default_pair=default_pair[0] if default_pair else None,
        files=tuple(layer.file for layer in layers),
    )


def unknown_name(kind: str, name: str, known: Iterable[str], detail: str = "") -> str:
    if not name.strip():
        return f"a {kind} name is empty{detail}; `speccli models` lists all"
    # Compared in lower case: "Gemma3-270M" is a near miss of "gemma3-270m", not an unrelated name.
    by_lower = {}
    for candidate in known:
        by_lower.setdefault(candidate.lower(), candidate)
    close = [by_lower[match] for match in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)]
    suggestion = f"close matches: {', '.join(close)}; " if close else ""
    return f"unknown {kind} '{name}'{detail}; {suggestion}`speccli models` lists all"


@dataclass(frozen=True)
class _Layer:
    file: Path
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    default_pair: str | None


def _read_layer(file: Path) -> _Layer:
    try:
        # Bounded: a device or a model file named by mistake must not fill memory.
        text = read_text_input(file, str(file)).decode("utf-8-sig")  # a byte-order mark (Windows editors write one) is no statement
    except UnicodeDecodeError:
        raise UnreadableFileError(f"{file}: not UTF-8 text, so not a models.toml") from None
    except SpeccliError as error:  # larger than any models.toml
        raise UnreadableFileError(f"{error}, so not a models.toml") from None
    except OSError as error:
        raise UnreadableFileError(f"cannot read {unreadable(file, error, 'models.toml')}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UnreadableFileError(_describe_toml_error(file, text, error)) from None
    return _parse_layer(document, file)


def _describe_toml_error(file: Path, text: str, error: tomllib.TOMLDecodeError) -> str:
    """`FILE, line N: problem: the line`, so the offending key is in view."""
    message = str(error)
    position = _TOML_ERROR_POSITION.search(message)
    if position is None:
        return f"{file}: invalid TOML: {message}"
    line_number = int(position["line"])
    problem = message[: position.start()].strip()
    lines = text.splitlines()
    line_text = lines[line_number - 1].strip() if line_number <= len(lines) else ""
    return f"{file}, line {line_number}: invalid TOML ({problem}): {line_text}"


def _parse_layer(document: dict, file: Path) -> _Layer:
    root = TomlTable(file, (), document)
    root.only(("default_pair", "models", "pairs"))
    models: dict[str, ModelEntry] = {}
    if "models" in root.values:
        models_table = root.table("models")
        for name in models_table.values:
            _check_name(models_table, name)
            models[name] = ModelEntry(name, _parse_source(models_table.table(name)), file)
    pairs: dict[str, PairEntry] = {}
    if "pairs" in root.values:
        pairs_table = root.table("pairs")
        for name in pairs_table.values:
            _check_name(pairs_table, name)
            pairs[name] = _parse_pair(pairs_table.table(name), name, file)
    return _Layer(file, models, pairs, root.string("default_pair", required=False))


def _check_name(table: TomlTable, name: str) -> None:
    if not _NAME.fullmatch(name):
        raise table.error("names may hold only ASCII letters, digits, '.', '_' and '-' (and start with a letter or digit)", name)
    if len(name) > MAX_NAME_LENGTH:
        raise table.error(f"names may be at most {MAX_NAME_LENGTH} characters long, got {len(name)}", name)


def _parse_source(entry: TomlTable) -> ModelSource:
    entry.only(SOURCE_KINDS)
    given = [key for key in SOURCE_KINDS if key in entry.values]
    if not given:
        raise entry.error(f"no source; give one of {one_of(SOURCE_KINDS)}")
    if len(given) > 1:
        raise entry.error(f"several sources ({', '.join(given)}); give exactly one")
    return SOURCE_KINDS[given[0]].parse(entry)


def _parse_pair(entry: TomlTable, name: str, file: Path) -> PairEntry:
    entry.only(_PAIR_KEYS)
    spec = entry.spec("spec", default=DEFAULT_SPEC)
    return PairEntry(
        name=name,
        target=entry.string("target"),
        draft=entry.string("draft", required=uses_draft_model(spec)),
        k=entry.k("k"),
        spec=spec,
        target_n_gpu_layers=entry.gpu_layers("target_n_gpu_layers", default=DEFAULT_N_GPU_LAYERS),
        draft_n_gpu_layers=entry.gpu_layers("draft_n_gpu_layers", default=DEFAULT_N_GPU_LAYERS),
        defined_in=file,
        rpc=entry.endpoints("rpc"),
        remember=entry.boolean("remember", default=False),
    )


def _check_references(
    models: dict[str, ModelEntry], pairs: dict[str, PairEntry], default_pair: tuple[str, Path] | None
) -> None:
    for entry in models.values():
        for base in entry.source.requires:
            where = f"{entry.defined_in}: {key_path('models', entry.name, entry.source.key, 'from')}"
            chain = [entry.name]
            pending = base
            while True:
                if pending not in models:
                    raise SpeccliError(f"{where}: {unknown_name('model', pending, models)}")
                if pending in chain:
                    raise SpeccliError(f"{where}: derivation loops: {' -> '.join([*chain, pending])}")
                chain.append(pending)
                further = models[pending].source.requires
                if not further:
                    break
                pending = further[0]
    for pair in pairs.values():
        for role in ("target", "draft"):
            model = getattr(pair, role)
            if model is not None and model not in models:
                where = f"{pair.defined_in}: {key_path('pairs', pair.name, role)}"
                raise SpeccliError(f"{where}: {unknown_name('model', model, models)}")
    if default_pair is not None and default_pair[0] not in pairs:
        raise SpeccliError(f"{default_pair[1]}: default_pair: {unknown_name('pair', default_pair[0], pairs)}")
