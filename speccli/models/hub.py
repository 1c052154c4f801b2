"""A model file on the Hugging Face Hub, kept in the Hugging Face cache (one file, a glob pattern, or
every part of a split GGUF). huggingface_hub shows progress and resumes partial downloads; this module
turns its failures into one line each, fails fast when the Hub cannot be reached, and checks a
pinned sha256 (after a download, and once for a file already in the cache), refusing a file that
differs without deleting it from a cache other entries and tools share."""
from __future__ import annotations

import fnmatch
import os
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

import httpx2  # huggingface_hub's HTTP client: its transport errors surface from downloads
import huggingface_hub
from huggingface_hub import errors as hub_errors
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import logging as hub_logging
from huggingface_hub.utils import validate_repo_id

from speccli.errors import SpeccliError
from speccli.gguf_files import SPLIT_PART, split_part_names
from speccli.models.schema import TomlTable
from speccli.models.sources import ModelFiles
from speccli.util.cache import refuse_empty_home
from speccli.util.hashing import cached_sha256

if TYPE_CHECKING:
    from speccli.models.config import ModelEntry

_COMMIT_HASH = re.compile(r"[0-9a-f]{40}")
# How long to wait for the Hub's host to answer before calling it unreachable (huggingface_hub itself
# retries for about 25 s with a line of noise per try).
_REACHABLE_TIMEOUT_S = 4


class NoMatchError(SpeccliError):
    """No file matches the entry's pattern."""


class HubUnreachableError(SpeccliError):
    """The Hub could not be asked (no network, or HF_HUB_OFFLINE): what is cached may still serve."""


@dataclass(frozen=True)
class HubSource:
    repo: str
    file: str  # a file name in the repository, or a glob pattern matching one model's file(s)
    revision: str | None = None
    sha256: str | None = None

    key: ClassVar[str] = "hf"
    requires: ClassVar[tuple[str, ...]] = ()
    fetched: ClassVar[bool] = True

    @classmethod
    def parse(cls, entry: TomlTable) -> HubSource:
        hub = entry.table("hf")
        hub.only(("repo", "file", "revision", "sha256"))
        repo = hub.string("repo")
        if repo.count("/") != 1:
            raise hub.error(f"expected 'owner/name', got '{repo}'", "repo")
        try:  # checked here, as huggingface_hub would check it at the first listing or download
            validate_repo_id(repo)
        except hub_errors.HFValidationError:
            raise hub.error(
                f"expected 'owner/name' of letters, digits, '-', '_' and '.' (neither starting nor ending with '-' "
                f"or '.', at most 96 characters), got '{repo}'", "repo"
            ) from None
        file = hub.string("file")
        if PurePosixPath(file).is_absolute() or ".." in PurePosixPath(file).parts or "\\" in file:
            raise hub.error(f"expected a file's path inside the repository, got '{file}'", "file")
        return cls(repo, file, hub.string("revision", required=False), hub.sha256("sha256", required=False))

    def describe(self) -> str:
        at_revision = f"@{self.revision}" if self.revision else ""
        return f"hf {self.repo}{at_revision} {self.file}"

    @property
    def is_pattern(self) -> bool:
        return any(character in self.file for character in "*?[")

    def cached_files(self, entry: ModelEntry, models: ModelFiles) -> list[Path] | None:
        files = self._cached_parts(entry)
        # A file other than the one pinned is not this model's (it stays: another entry may use it).
        if files is not None and self.sha256 is not None and cached_sha256(files[0]) != self.sha256:
            return None
        return files

    def _cached_parts(self, entry: ModelEntry, *, explain: bool = False) -> list[Path] | None:
        """The model's files in the Hugging Face cache, as huggingface_hub finds them; None if not all
        there, or, with `explain`, why not where the cache holds files the pattern matches (several
        models, or some parts of a split one): offline, "not in the cache" would mislead."""
        snapshot = self._cached_snapshot()
        if snapshot is None:
            return None

        def snapshot_files() -> list[str]:
            return [path.relative_to(snapshot).as_posix() for path in snapshot.rglob("*") if path.is_file()]

        try:
            parts = self._model_parts(entry, snapshot_files, "the cache")
        except NoMatchError:
            return None  # nothing cached matches the pattern (yet)
        except SpeccliError:
            if explain:
                raise
            return None
        files = []
        for part in parts:
            cached = huggingface_hub.try_to_load_from_cache(self.repo, part, revision=self.revision)
            if not isinstance(cached, str):  # None, or the marker for "known not to exist upstream"
                return None
            files.append(Path(cached))
        return files

    def obtain(self, entry: ModelEntry, models: ModelFiles, *, update: bool, quiet: bool) -> list[Path]:
        cached = self._cached_parts(entry)
        if cached is not None:
            # A pinned file is checked before use, wherever it came from (the check is remembered).
            self._verify(entry, cached[0])
            if not update:
                return cached
        try:
            files = self._download(entry)
        except HubUnreachableError:
            if cached is not None:
                return cached  # offline: what is cached is the newest we can have
            self._cached_parts(entry, explain=True)
            raise
        if files != cached:
            self._verify(entry, files[0])
        return files

    def _download(self, entry: ModelEntry) -> list[Path]:
        refuse_empty_home("HF_HOME", "HF_HUB_CACHE")  # huggingface_hub would download into /.cache/huggingface
        _ensure_reachable(entry, self)

        def remote_files() -> list[str]:
            with self._errors(entry, self.file):
                return huggingface_hub.list_repo_files(self.repo, revision=self.revision)

        files = []
        for part in self._model_parts(entry, remote_files, self.repo):
            # hf_hub_download shows progress, resumes a partial download (its `.incomplete` file), and
            # only links a file into the snapshot once it is complete.
            with self._errors(entry, part):
                files.append(Path(huggingface_hub.hf_hub_download(self.repo, part, revision=self.revision)))
        return files

    def _model_parts(self, entry: ModelEntry, repo_files: Callable[[], list[str]], where: str) -> list[str]:
        """The repository files making up the model: one file, or every part of a split GGUF, first part
        first. `repo_files` lists the repository (or what the cache holds of it, `where`); it is only
        called for a glob pattern."""
        if self.is_pattern:
            matches = sorted(file for file in repo_files() if fnmatch.fnmatchcase(file, self.file))
            if not matches:
                raise NoMatchError(f"model '{entry.name}': no file in {self.repo} matches '{self.file}'")
        else:
            matches = [self.file]
        split = SPLIT_PART.fullmatch(matches[0])
        if split:
            count = int(split["count"])
            parts = split_part_names(split["prefix"], count)
            if not self.is_pattern or set(matches) == set(parts):
                return parts
            if set(matches) < set(parts):
                missing = ", ".join(part for part in parts if part not in matches)
                raise SpeccliError(f"model '{entry.name}': {where} holds {len(matches)} of the {count} parts of "
                                   f"{split['prefix']}.gguf; missing: {missing}")
        elif len(matches) == 1:
            return matches
        raise SpeccliError(
            f"model '{entry.name}': '{self.file}' matches several models in {self.repo} ({', '.join(matches)}); make it match one"
        )

    def _storage(self) -> Path:
        return hub_cache_dir() / repo_folder_name(repo_id=self.repo, repo_type="model")

    def _cached_snapshot(self) -> Path | None:
        """The cached snapshot folder for the source's revision, as huggingface_hub lays it out."""
        revision = self.revision or "main"
        if _COMMIT_HASH.fullmatch(revision):
            commit = revision
        else:
            ref = self._storage() / "refs" / revision
            if not ref.is_file():
                return None
            commit = ref.read_text().strip()
        snapshot = self._storage() / "snapshots" / commit
        return snapshot if snapshot.is_dir() else None

    def _verify(self, entry: ModelEntry, file: Path) -> None:
        if self.sha256 is None:
            return
        actual = cached_sha256(file)
        if actual != self.sha256:
            # Not deleted: the cache is huggingface_hub's, shared by other entries and tools, and the file
            # is what the Hub serves at that revision (huggingface_hub checks what it downloads), so the
            # pin is what is wrong, or pins another revision. This entry never uses it (see cached_files).
            raise SpeccliError(
                f"model '{entry.name}': {file.name} from {self.repo} has sha256 {actual}, expected {self.sha256}; "
                "not used (it stays in the Hugging Face cache)"
            )

    @contextmanager
    def _errors(self, entry: ModelEntry, file: str) -> Iterator[None]:
        """huggingface_hub's exceptions, as one line each naming the model and what to do; its retry
        warnings are kept off the terminal."""
        where = f"model '{entry.name}': {file} from {self.repo}"
        previous_level = hub_logging.get_verbosity()
        hub_logging.set_verbosity_error()
        try:
            yield
        except hub_errors.GatedRepoError:
            raise SpeccliError(
                f"{where}: the repository is gated: accept its terms on huggingface.co/{self.repo} and log in (`hf auth login`)"
            ) from None
        except hub_errors.RepositoryNotFoundError:
            raise SpeccliError(f"{where}: no such repository on huggingface.co (or it is private: log in with `hf auth login`)") from None
        except hub_errors.RevisionNotFoundError:
            raise SpeccliError(f"{where}: no revision '{self.revision}' in the repository") from None
        except hub_errors.RemoteEntryNotFoundError:
            raise SpeccliError(f"{where}: no such file at revision '{self.revision or 'main'}'") from None
        except (hub_errors.OfflineModeIsEnabled, hub_errors.LocalEntryNotFoundError):
            raise HubUnreachableError(
                f"{where}: cannot reach huggingface.co (no network, or HF_HUB_OFFLINE is set) and it is not in the cache {hub_cache_dir()}"
            ) from None
        except hub_errors.HfHubHTTPError as error:
            raise SpeccliError(f"{where}: huggingface.co answered: {str(error).splitlines()[0]}") from None
        except (httpx2.TransportError, hub_errors.XetDownloadError, ConnectionError, TimeoutError) as error:
            # Only a partial download (huggingface_hub's `.incomplete` file) can be resumed.
            partial = any(self._storage().glob("blobs/*.incomplete"))
            again = "resumes the download" if partial else "tries again"
            raise HubUnreachableError(f"{where}: network failure ({error or type(error).__name__}); `speccli pull {entry.name}` {again}") from None
        except OSError as error:
            raise SpeccliError(f"{where}: cannot write to the cache {hub_cache_dir()}: {error.strerror or error}") from None
        finally:
            hub_logging.set_verbosity(previous_level)


def hub_cache_dir() -> Path:
    # Read at call time: huggingface_hub takes HF_HOME / HF_HUB_CACHE from the environment at import.
    return Path(huggingface_hub.constants.HF_HUB_CACHE)


def _ensure_reachable(entry: ModelEntry, source: HubSource) -> None:
    problem = hub_unreachable_reason()
    if problem is not None:
        raise HubUnreachableError(
            f"model '{entry.name}': cannot reach huggingface.co ({problem}) and {source.file} is not in the cache {hub_cache_dir()}"
        )


@cache
def hub_unreachable_reason() -> str | None:
    """Why the Hub's host cannot be reached (a few seconds at most), or None when it answers. Skipped
    (None) behind a proxy, which only the HTTP client knows how to go through; asked once per process."""
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = urlsplit(huggingface_hub.constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=_REACHABLE_TIMEOUT_S):
            return None
    except socket.gaierror:
        return f"cannot resolve {host}"
    except OSError as error:
        return f"{host}:{port}: {error.strerror or error or 'timed out'}"
