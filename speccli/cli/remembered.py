"""`speccli remembered`: the stores of earlier replies `--remember` keeps (they hold your generated text)."""
from __future__ import annotations

from typing import Annotated

import typer


def remembered(clear: Annotated[bool, typer.Option("--clear", help="Delete every store.")] = False) -> None:
    """List the earlier replies kept on disk for the suffix draft source (--remember), or delete them."""
    from speccli.drafting.suffix import describe_stores, stores_dir

    stores = describe_stores()
    if clear:
        for store in stores:
            store["file"].unlink(missing_ok=True)
        typer.echo(f"deleted {len(stores)} store{'' if len(stores) == 1 else 's'} from {stores_dir()}")
        return
    if not stores:
        typer.echo(f"no stores in {stores_dir()} (chat and serve keep one with --remember)")
        return
    for store in stores:
        typer.echo(f"{store['file']}  {store['model']}  {store['tokens']:,} tokens  {store['bytes'] / 2**20:.1f} MiB")
