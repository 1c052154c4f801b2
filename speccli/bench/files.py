"""The bench report on disk: where `--json` may write (checked before measuring), writing it (atomically
to a file, through a symlink to its target, directly to stdout or a special file), and reading one back
for `--compare`, validated against the report's types (the generated schema)."""
from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable, Literal

from pydantic import ValidationError

from speccli.bench.report import KIND, SCHEMA_VERSION, BenchReport
from speccli.errors import ReaderGoneError, SpeccliError, StdoutError, UnreadableFileError
from speccli.util.files import build_atomically, read_text_input
from speccli.util.format import json_safe

STDOUT_NAME = "-"


@dataclass(frozen=True)
class JsonDestination:
    """Where the JSON report goes. "file": replaced atomically at `path` (a symlink's target, if `given`
    is a link); "special": a FIFO or device, opened and written as it is; "stdout": the JSON is the
    command's output, and the human-readable report goes to stderr."""

    given: Path
    kind: Literal["file", "special", "stdout"]
    path: Path

    @property
    def is_stdout(self) -> bool:
        return self.kind == "stdout"


def json_destination(path: Path | None) -> JsonDestination | None:
    """Refuse an unusable --json path before spending minutes measuring."""
    if path is None:
        return None
    if str(path) == STDOUT_NAME:
        return JsonDestination(path, "stdout", path)
    try:
        status = os.stat(path)
    except FileNotFoundError:
        status = None
    except OSError as error:  # a symlink loop, a path through a file, no permission
        raise SpeccliError(f"--json {path}: {error.strerror}") from None
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise SpeccliError(f"--json {path}: is a directory; give a file name")
    if status is not None and _is_stdout(status):  # /dev/stdout, whether a pipe, a terminal or a file
        return JsonDestination(path, "stdout", path)
    if status is not None and not stat.S_ISREG(status.st_mode):
        if not os.access(path, os.W_OK):
            raise SpeccliError(f"--json {path}: cannot write to it")
        return JsonDestination(path, "special", path)
    # Replace a symlink's target, not the link (a dangling link's target is created).
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    parent = real.parent if str(real.parent) else Path(".")
    if not parent.is_dir():
        raise SpeccliError(f"--json {path}: the folder {parent} does not exist")
    try:  # Only a real file proves the folder takes files (os.access says yes to /proc as root).
        handle, probe = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".probe", dir=parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise SpeccliError(f"--json {path}: cannot write in {parent} ({error.strerror})") from None
    return JsonDestination(path, "file", real)


def refuse_overwriting(destination: JsonDestination | None, inputs: Iterable[tuple[str, Path | None]]) -> None:
    """The report must not replace a file this run reads (`inputs`: what it is, its path): given the
    draft's own path, --json replaced a 253 MB model with 13 kB of JSON."""
    if destination is None or destination.kind != "file":
        return
    for what, path in inputs:
        if path is not None and _same_file(destination.path, path):
            raise SpeccliError(f"--json {destination.given}: is the {what} this run reads; write the report elsewhere")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing (a new report file), or unreadable: not the same file
        return False


def _is_stdout(status: os.stat_result) -> bool:
    try:
        out = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test runner's capture)
        return False
    return (status.st_dev, status.st_ino) == (out.st_dev, out.st_ino)


def report_json(report: BenchReport) -> str:
    return json.dumps(json_safe(report.model_dump(mode="json")), indent=2, ensure_ascii=False) + "\n"


def write_report(destination: JsonDestination, report: BenchReport) -> None:
    """Write the report; if the destination fails after all (disk full, a folder gone), keep the report
    in the temporary folder and say where, so a finished measurement is never lost."""
    text = report_json(report)
    try:
        if destination.is_stdout:
            sys.stdout.write(text)
            sys.stdout.flush()
        elif destination.kind == "special":
            with open(destination.path, "w", encoding="utf-8") as stream:
                stream.write(text)
        else:
            build_atomically(destination.path, lambda partial: partial.write_text(text, encoding="utf-8"))
    except BrokenPipeError:
        kept = _keep_elsewhere(text)  # a reader gone (`| head`, a FIFO's) must not take the measurement with it
        if destination.is_stdout:  # exit 141, as any command whose reader left
            raise ReaderGoneError(f"--json {destination.given}: the reader of stdout went away; the report is kept "
                                  f"in {kept}") from None
        raise SpeccliError(f"--json {destination.given}: its reader went away; the report is kept in {kept}") from None
    except OSError as error:
        kept = _keep_elsewhere(text)
        failure = StdoutError if destination.is_stdout else SpeccliError
        to_stdout = " to stdout" if destination.is_stdout else ""
        raise failure(f"--json {destination.given}: cannot write it{to_stdout} ({error.strerror}); "
                      f"the report is kept in {kept}") from None


def _keep_elsewhere(text: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    handle, name = tempfile.mkstemp(prefix=f"speccli-bench-{stamp}-", suffix=".json")
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        stream.write(text)
    return Path(name)


def _refuse_constant(name: str) -> None:
    """Python's json reads NaN and Infinity, which JSON has not: `bench --json` never writes them, and
    compared they would print as figures."""
    raise ValueError(f"{name} is not a JSON number")


def load_report(path: Path) -> BenchReport:
    """A report written by `speccli bench --json`, checked against the report's types; one line naming
    the first problem otherwise."""
    try:
        text = read_text_input(path, str(path)).decode("utf-8")
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UnreadableFileError(f"{path}: is a directory, not a bench report") from None
    except OSError as error:
        raise UnreadableFileError(f"{path}: cannot read it as a bench report ({error})") from None
    except UnicodeDecodeError as error:  # content, as a prompts file's: a value refused
        raise SpeccliError(f"{path}: cannot read it as a bench report ({error})") from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise UnreadableFileError(f"{path}: not a speccli bench JSON report (not JSON: {error})") from None
    except ValueError as error:
        raise UnreadableFileError(f"{path}: not a speccli bench JSON report ({error})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UnreadableFileError(f"{path}: not a speccli bench JSON report (written by `speccli bench --json`)")
    # Before a run could be stopped early (4), before host time (5), before the draft's prompt time (6).
    if data.get("schema_version") in (4, 5, 6):
        data.setdefault("stopped", None)
        data.update(schema_version=SCHEMA_VERSION)
        text = json.dumps(data)
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        older = isinstance(version, int) and version < SCHEMA_VERSION
        raise SpeccliError(
            f"{path}: bench report schema version {version!r}, this speccli reads versions 4 to {SCHEMA_VERSION}"
            + ("; it was written by an older speccli: run the benchmark again to compare" if older else "")
        )
    try:
        report = BenchReport.model_validate_json(text, strict=True)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise SpeccliError(f"{path}: not a valid bench report: {where}: {first['msg']}") from None
    # bench measures each configuration once; a second result under one label would hide the first.
    labels = [result.label for result in report.results]
    repeated = next((label for label in labels if labels.count(label) > 1), None)
    if repeated is not None:
        raise SpeccliError(f"{path}: not a valid bench report: results: configuration {repeated} appears twice")
    return report
