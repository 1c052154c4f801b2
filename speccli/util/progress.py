"""The progress bar bench and quant-check show on stderr while they measure."""
from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def progress_bar(console: Console) -> Progress:
    """What is being measured, a bar, done/total, time so far and left; gone once finished, and
    nothing at all where `console` is not a terminal (a log gets no animation)."""
    return Progress(
        TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    )
