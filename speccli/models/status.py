"""`speccli models`: what each registry entry is, whether it is on disk, and the pairs (disk only, no network)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Group
from rich.table import Table

from speccli.errors import UnreadableFileError
from speccli.gguf_files import model_files, require_loadable_gguf
from speccli.models.config import Registry
from speccli.models.resolve import RegistryFiles
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
                problem=_problem(cached[0]) if cached else None,
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


def _problem(path: Path) -> str | None:
    """What loading `path` would refuse, without its name: a file there is not yet a model (a path
    entry naming another kind of file, a copy cut short, a build emptied since)."""
    try:
        require_loadable_gguf(path, weights=True)
    except UnreadableFileError as error:
        reason = str(error).removeprefix(f"{path}: ")
        return "not a GGUF file" if reason.startswith("not a GGUF file") else reason
    return None


def registry_tables(registry: Registry) -> Group:
    """The models (on disk or not, source) and the pairs; at 80 columns each name stays whole (it is typed
    back), a pair's models one per line."""
    models = _table("Models", "name", "on disk", "source")
    for status in model_statuses(registry):
        on_disk = (status.problem or format_size(status.size_bytes)) if status.path else "not cached"
        models.add_row(status.name, on_disk, status.source)
    pairs = _table("Pairs", "name", "target, draft", "k", "spec", "ngl", wrapped=("target, draft",))
    pairs.caption, pairs.caption_justify = "*: the default pair", "left"
    for pair in registry.pairs.values():
        pairs.add_row(
            pair.name + (" *" if pair.name == registry.default_pair else ""),
            f"{pair.target} {pair.draft or 'none (lookup)'}",
            str(pair.k),
            pair.spec,
            f"{pair.target_n_gpu_layers}/{pair.draft_n_gpu_layers}",
        )
    return Group(models, pairs)


def _table(title: str, *columns: str, wrapped: tuple[str, ...] = ("source",)) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    for column in columns:
        table.add_column(column, no_wrap=column not in wrapped, overflow="fold")
    return table
