"""`speccli models`: what each registry entry is, whether it is on disk, and the pairs (disk only, no network)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from speccli.errors import UnreadableFileError
from speccli.gguf_files import model_files, require_loadable_gguf
from speccli.models.config import Registry
from speccli.models.resolve import RegistryFiles
from speccli.models.sources import LocalSource, describe_missing
from speccli.util.format import format_size


@dataclass(frozen=True)
class ModelStatus:
    name: str
    source: str
    path: Path | None  # the file llama.cpp loads, when it is on disk
    size_bytes: int | None  # all of the model's files, when on disk
    problem: str | None = None  # why the file on disk cannot be loaded ("not a GGUF file", "cut short: ...")


def model_statuses(registry: Registry) -> list[ModelStatus]:
    files = RegistryFiles(registry)
    statuses = []
    for name, entry in registry.models.items():
        cached = files.cached(name)
        statuses.append(
            ModelStatus(
                name=name,
                source=entry.source.describe(),
                path=cached[0] if cached else None,
                size_bytes=_size_on_disk(cached) if cached else None,
                problem=_problem(cached[0]) if cached else _not_a_file(entry.source),
            )
        )
    return statuses


def _size_on_disk(files: list[Path]) -> int:
    """The bytes of a model's files, a split model's later parts included where only its first file is
    named (a `path` entry, a build): those llama.cpp opens beside it."""
    if len(files) == 1:
        try:
            files = model_files(files[0])
        except UnreadableFileError:  # not a GGUF: `_problem` says so; its size is the file's
            pass
    return sum(file.stat().st_size for file in files if file.is_file())


def _not_a_file(source: object) -> str | None:
    """Why a `path` entry's path, there but no file (a directory, a loop of links), is not cached."""
    if isinstance(source, LocalSource) and (source.path.exists() or source.path.is_symlink()):
        return describe_missing(source.path)
    return None


def _problem(path: Path) -> str | None:
    """What loading `path` would refuse, without its name: a file there is not yet a model (a path
    entry naming another kind of file, a copy cut short, a build emptied since)."""
    try:
        require_loadable_gguf(path, weights=True)
    except UnreadableFileError as error:
        reason = str(error).removeprefix(f"{path}: ")
        return "not a GGUF file" if reason.startswith("not a GGUF file") else reason
    return None


def registry_view(registry: Registry, console: Console) -> Group:
    """The models (on disk or not, source) and the pairs: each a table where it fits the console with
    every name and word whole (names are typed back), else each entry's name with its fields below it."""
    models = [(status.name, (status.problem or format_size(status.size_bytes)) if status.path else status.problem or "not cached",
               status.source) for status in model_statuses(registry)]
    pairs = [(pair.name + (" (default)" if pair.name == registry.default_pair else ""), pair.target,
              pair.draft or "none (lookup)", str(pair.k), pair.spec, f"{pair.target_n_gpu_layers}/{pair.draft_n_gpu_layers}")
             for pair in registry.pairs.values()]
    parts: list[RenderableType] = []
    for title, columns, rows in (("Models", ("name", "on disk", "source"), models),
                                 ("Pairs", ("name", "target", "draft", "k", "spec", "ngl"), pairs)):
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      collapse_padding=True)
        for column in columns:
            table.add_column(column, no_wrap=column != "source")
        for row in rows:
            table.add_row(*map(Text, row))  # as written: a name or path may hold rich's markup, "[b]"
        if _least_width(columns, rows) <= console.width:
            parts.append(table)
        else:
            parts.append(Text(title, style="table.title"))
            for row in rows:  # the name, then its fields indented beneath it
                fields = ", ".join(f"{column} {value}" for column, value in zip(columns[1:], row[1:]))
                parts += [Text(row[0], style="bold"), Padding(Text(fields), (0, 0, 0, 2))]
    return Group(*parts)


def _least_width(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> int:
    """The narrowest the table can be with every name whole and the source broken at spaces only (two
    spaces between columns)."""
    def least(column: str, cell: str) -> int:
        return max(map(len, cell.split()), default=0) if column == "source" else len(cell)

    widths = [max(len(column), *(least(column, row[i]) for row in rows)) for i, column in enumerate(columns)]
    return sum(widths) + 2 * (len(columns) - 1)
