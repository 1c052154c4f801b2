"""`speccli remembered`: the stores of earlier replies `--remember` keeps (they hold your generated text),
and what `--k auto` learnt about each pair (no text)."""
from __future__ import annotations

import stat
from typing import Annotated

import typer


def remembered(clear: Annotated[bool, typer.Option("--clear", help="Delete every store and what auto learnt.")] = False) -> None:
    """List what is kept between runs (replies for the suffix source with --remember, what --k auto learnt), or delete it."""
    from speccli.drafting.learnt import describe, learnt_files
    from speccli.drafting.suffix import describe_stores, killed_saves, store_files, stores_dir
    from speccli.errors import SpeccliError, UnreadableFileError, unreadable

    folder = stores_dir()
    try:  # a file or a loop of links there is not "no stores"
        if not stat.S_ISDIR(folder.stat().st_mode):
            raise UnreadableFileError(f"{folder}: not a folder, where speccli keeps remembered replies")
    except FileNotFoundError as error:
        if folder.is_symlink():
            raise unreadable(folder, error, "folder") from None
    except OSError as error:
        raise unreadable(folder, error, "folder") from None
    if clear:
        deleted, failed = 0, []
        for path in [*store_files(), *killed_saves(), *learnt_files()]:
            try:
                path.unlink(missing_ok=True)
                deleted += 1
            except OSError as error:
                failed.append(f"{path}: cannot be deleted ({error.strerror or error})")
        typer.echo(f"deleted {deleted} file{'' if deleted == 1 else 's'} from {folder}")
        if failed:
            raise SpeccliError("; ".join(failed))
        return
    stores, learnt = describe_stores(), learnt_files()
    if not stores and not learnt:
        typer.echo(f"no stores in {folder} (chat and serve keep one with --remember)")
        return
    for store in stores:
        typer.echo(f"{store['file']}  {store['model']}  {store['tokens']:,} tokens  {store['bytes'] / 2**20:.1f} MiB")
    for path in learnt:
        typer.echo(f"{path}  {describe(path)}")
