"""`speccli check-vocab DRAFT TARGET`: can DRAFT draft for TARGET, read from metadata only."""
from __future__ import annotations

from typing import Annotated

import typer

from speccli.cli.options import ConfigOption


def check_vocab(
    draft: Annotated[str, typer.Argument(metavar="DRAFT", help="Draft model: registry name or GGUF path.")],
    target: Annotated[str, typer.Argument(metavar="TARGET", help="Target model: registry name or GGUF path.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Check that DRAFT can draft for TARGET: same token ids, same tokenization. Reads no weights.

    Exit codes: 0 identical or compatible, 1 incompatible, 2 a model could not be found or read.
    """
    from rich.console import Console
    from rich.text import Text

    from speccli.models.config import load_registry
    from speccli.models.resolve import resolve_model
    from speccli.vocab.check import check_pair
    from speccli.vocab.report import VocabVerdict

    registry = load_registry(*config or ())
    # Never downloads: a registry model must be on disk already (`speccli pull` fetches it).
    draft_path, target_path = (resolve_model(name, registry, fetch=False) for name in (draft, target))
    report = check_pair(draft_path, target_path)
    if json_output:
        typer.echo(report.to_json())
    else:
        text = Text(report.explain())
        style = {VocabVerdict.IDENTICAL: "bold green", VocabVerdict.COMPATIBLE: "green", VocabVerdict.INCOMPATIBLE: "bold red"}
        text.highlight_regex(r"(?m)^verdict: .*$", style[report.verdict])
        Console(highlight=False, soft_wrap=True).print(text)
    raise typer.Exit(report.exit_code)
