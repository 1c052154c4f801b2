"""`speccli models` (the registry as tables) and `speccli pull` (obtain models into the caches)."""
from __future__ import annotations

from typing import Annotated

import typer

from speccli.cli.options import ConfigOption


UNWRAPPED_WIDTH = 1000  # wider than any row of the tables `models` prints


def models(config: ConfigOption = None) -> None:
    """List the named models (size on disk or not cached, source) and the pairs."""
    from rich.console import Console

    from speccli.models.config import load_registry
    from speccli.models.status import registry_view

    registry = load_registry(*config or ())
    out = Console()
    if out.is_terminal:
        out.print(registry_view(registry, out))
        return
    # A pipe or file: each entry a table row on one line, whole, for grep, without the tables' padding.
    out = Console(width=UNWRAPPED_WIDTH)
    with out.capture() as captured:
        out.print(registry_view(registry, out))
    typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def pull(
    names: Annotated[list[str], typer.Argument(metavar="NAME", help="Model or pair names (a pair pulls its target and draft).")],
    config: ConfigOption = None,
) -> None:
    """Download or build models into the local caches, with progress; prints each model's file."""
    from speccli.models.config import load_registry
    from speccli.models.resolve import pull_models

    for name, path in pull_models(load_registry(*config or ()), names):
        typer.echo(f"{name}: {path}")
