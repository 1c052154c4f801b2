"""`speccli remembered`: the stores of earlier replies `--remember` keeps (they hold your generated text),
and what `--k auto` learnt about each pair (no text)."""
from __future__ import annotations

import stat
from pathlib import Path
from typing import Annotated

import typer


def remembered(clear: Annotated[bool, typer.Option("--clear", help="Delete every store and what auto learnt.")] = False) -> None:
    """List what is kept between runs (replies for the suffix source with --remember, what --k auto learnt), or delete it."""
    from speccli.remembered.learnt import describe, learnt_files
    from speccli.util.format import one_line
    from speccli.remembered.stores import describe_stores, stores_dir
    from speccli.errors import UnreadableFileError, unreadable

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
        _clear(folder)
        return
    stores, learnt = describe_stores(), learnt_files()
    if not stores and not learnt:
        typer.echo(f"no stores in {folder} (chat and serve keep one with --remember)")
        return
    for store in stores:  # a file name may hold a newline or an escape sequence: each listing line stays one
        tokens = "" if store["tokens"] is None else f"  {store['tokens']:,} tokens"
        size = "" if store["bytes"] is None else f"  {store['bytes'] / 2**20:.1f} MiB"
        in_use = f"  (in use by pid {store['holder']})" if store.get("holder") else ""
        typer.echo(f"{one_line(str(store['file']))}  {store['model']}{tokens}{size}{in_use}")
    for path in learnt:
        typer.echo(f"{one_line(str(path))}  {describe(path)}")


def _clear(folder: Path) -> None:
    """Delete every store, killed save and policy file; none while a running chat or serve writes a store
    (it would write the replies back at its next save): that is refused, naming it, and nothing deleted.
    Each store's lock is held while it goes, so no process starts writing it meanwhile."""
    from speccli.remembered.learnt import cleared_marker, learnt_files
    from speccli.remembered.stores import killed_saves, owner_lock, stores_owned, store_files
    from speccli.errors import SpeccliError
    from speccli.util.files import try_lock

    held, locks = [], []
    try:
        for store in sorted({*store_files(), *stores_owned()}):
            try:
                lock, holder = try_lock(owner_lock(store))
            except OSError as error:
                raise SpeccliError(f"{owner_lock(store)}: cannot be locked ({error.strerror or error}); nothing was deleted") from None
            if lock is None:
                held.append(f"{store.name} is written by a running speccli process{f' (pid {holder})' if holder else ''}")
            else:
                locks.append((owner_lock(store), lock))
        if held:
            raise SpeccliError(f"{'; '.join(held)}: stop it (chat or serve with --remember), then clear; nothing was deleted")
        deleted, failed = 0, []
        for path in [*store_files(), *killed_saves(), *learnt_files()]:
            try:
                path.unlink(missing_ok=True)
                deleted += 1
            except OSError as error:
                failed.append(f"{path}: cannot be deleted ({error.strerror or error})")
        try:  # a running chat or server writes no policy file again (a store's writer was refused above)
            cleared_marker().parent.mkdir(parents=True, exist_ok=True)
            cleared_marker().touch()
        except OSError as error:
            failed.append(f"{cleared_marker()}: cannot be written ({error.strerror or error}); a running chat or "
                          "server may write what auto learnt again")
    finally:
        for lock_file, lock in locks:  # no store left to own: its lock goes too (unlinked while held)
            lock_file.unlink(missing_ok=True)
            lock.close()
    typer.echo(f"deleted {deleted} file{'' if deleted == 1 else 's'} from {folder}")
    if failed:
        raise SpeccliError("; ".join(failed))
