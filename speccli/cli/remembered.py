"""`speccli remembered`: the stores of earlier replies `--remember` keeps (they hold your generated text)."""
from __future__ import annotations

from typing import Annotated

import typer


def remembered(clear: Annotated[bool, typer.Option("--clear", help="Delete every store.")] = False) -> None:
    """List the earlier replies kept on disk for the suffix draft source (--remember), or delete them."""
    from speccli.drafting.suffix import describe_stores, store_files, stores_dir
    from speccli.errors import SpeccliError

    if clear:
        deleted, failed = 0, []
        for path in store_files():
            try:
                path.unlink(missing_ok=True)
                deleted += 1
            except OSError as error:
                failed.append(f"{path}: cannot be deleted ({error.strerror or error})")
        typer.echo(f"deleted {deleted} store{'' if deleted == 1 else 's'} from {stores_dir()}")
        if failed:
            raise SpeccliError("; ".join(failed))
        return
    stores = describe_stores()
    if not stores:
        typer.echo(f"no stores in {stores_dir()} (chat and serve keep one with --remember)")
        return
    for store in stores:
        typer.echo(f"{store['file']}  {store['model']}  {store['tokens']:,} tokens  {store['bytes'] / 2**20:.1f} MiB")
