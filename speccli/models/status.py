"""`speccli models`: what each registry entry is, whether it is on disk, and the pairs (disk only, no network)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Group
from rich.table import Table

from speccli.gguf_meta import starts_as_gguf
from speccli.models.config import Registry
from speccli.models.resolve import RegistryFiles
from speccli.settings import format_k
from speccli.util.format import format_size


@dataclass(frozen=True)
class ModelStatus:
    name: str
    source: str
    path: Path | None  # the file llama.cpp loads, when it is on disk
    size_bytes: int | None  # all of the model's files, when on disk
    pairs: tuple[str, ...]
    is_gguf: bool = True  # False: the file on disk does not begin as a GGUF file (pull and loading refuse it)


def model_statuses(registry: Registry) -> list[ModelStatus]:
    files = RegistryFiles(registry)
    statuses = []
    for name, entry in registry.models.items():
        cached = files.cached(name)
        in_pairs = tuple(pair.name for pair in registry.pairs.values() if name in (pair.target, pair.draft))
        statuses.append(
            ModelStatus(
                name=name,
                source=entry.source.describe(),
                path=cached[0] if cached else None,
                size_bytes=sum(file.stat().st_size for file in cached) if cached else None,
                pairs=in_pairs,
                is_gguf=starts_as_gguf(cached[0]) if cached else True,
            )
        )
    return statuses


def registry_tables(registry: Registry) -> Group:
    """The models (source, size on disk, cached or not, pairs) and the pairs."""
    models = Table(title="Models", title_justify="left")
    for column in ("name", "source", "size", "cached", "pairs"):
        models.add_column(column, overflow="fold")
    for status in model_statuses(registry):
        models.add_row(
            status.name,
            status.source,
            format_size(status.size_bytes),
            ("yes" if status.is_gguf else "not a GGUF file") if status.path else "no",
            ", ".join(status.pairs),
        )
    pairs = Table(title="Pairs", title_justify="left")
    for column in ("name", "target", "draft", "k", "spec", "gpu layers (target/draft)"):
        pairs.add_column(column, overflow="fold")
    for pair in registry.pairs.values():
        default = " (default)" if pair.name == registry.default_pair else ""
        pairs.add_row(
            pair.name + default,
            pair.target,
            pair.draft or "none (lookup)",
            format_k(pair.k),
            pair.spec,
            f"{pair.target_n_gpu_layers}/{pair.draft_n_gpu_layers}",
        )
    return Group(models, pairs)
