"""What chat shows: streamed reply text with token provenance, and statistics.

The statistics renderables are `speccli.chat.stats_view`'s. Output goes one of three ways:

* a terminal: styled text; while a reply streams, one rich `Live` holds the unfinished line and a
  statistics panel, refreshed by the generation loop itself at most `REFRESH_HZ` times a second
  (no refresh thread racing the loop, so nothing to lock and nothing to flicker). Finished lines
  are printed above the live region for good, so a long reply scrolls like ordinary output.
* plain (stdout is a pipe or file): the reply text only, never an ANSI code; notices and
  statistics go to stderr.
* JSON (`--json`): one JSON object per reply on stdout; notices on stderr.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Literal, TextIO

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.text import Text

from speccli.chat.stats_view import stats_panel, stats_record, summary_line
from speccli.core.stats import RunStats, Source

Mode = Literal["terminal", "plain", "json"]

REFRESH_HZ = 4

PROVENANCE_STYLES = {
    Source.DRAFT: "green",
    Source.CORRECTION: "bold yellow",
    Source.BONUS: "cyan",
    Source.TARGET: "",
}
# Model text shown on a terminal must not drive it: C0 controls (ESC above all) and DEL become their
# visible Unicode "control pictures" (U+2400 + code), and C1 controls (U+0080-U+009F: U+009B is a
# one-character CSI to some terminals), which have no pictures, U+FFFD. Pipes get the text as generated.
_CONTROL_PICTURES = ({code: 0x2400 + code for code in range(0x20) if chr(code) not in "\n\t"} | {0x7F: 0x2421}
                     | {code: 0xFFFD for code in range(0x80, 0xA0)})
PROVENANCE_NAMES = {
    Source.DRAFT: "draft accepted", Source.CORRECTION: "target correction", Source.BONUS: "bonus",
    Source.TARGET: "target alone (no draft that step)",  # the default colour: said, since it has none
}


def provenance_legend() -> Text:
    legend = Text()
    legend.append("tokens: ", style="dim")
    for index, (source, name) in enumerate(PROVENANCE_NAMES.items()):
        legend.append(" · " if index else "", style="dim")
        legend.append(name, style=PROVENANCE_STYLES[source])
    return legend


# --- a reply as it streams ----------------------------------------------------------------------


class LiveReply:
    """The terminal view of one reply: finished rows printed for good, the rest in one `Live`.

    Rendering the live region costs milliseconds, so it happens only at a refresh: finished rows
    are printed then, all in one print (which redraws the region too), never one print per line.
    """

    def __init__(self, console: Console, *, provenance: bool, target_token_seconds: float | None) -> None:
        self._console = console
        self._provenance = provenance
        self._target_token_seconds = target_token_seconds
        self._unfinished = Text()  # text not yet printed for good: the last row, and any since the last refresh
        self._stats: RunStats | None = None
        self._live = Live(
            self, console=console, auto_refresh=False, transient=True, redirect_stdout=False, redirect_stderr=False
        )
        self._last_refresh = 0.0

    def __enter__(self) -> LiveReply:
        self._live.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        # The rows not yet printed for good go above the live region first: left in it, a reply that
        # ended between refreshes made the region taller than a short terminal, and what scrolled off
        # the screen could not be erased (the reply's rows came out twice).
        self._print_finished_rows()
        self._live.stop()  # transient: the live region goes, the summary line replaces it
        if self._unfinished:
            self._console.print(self._unfinished)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self._unfinished:
            yield self._unfinished
        if self._stats is not None:
            # The region must fit the screen, with the line the cursor rests on below it and the reply's
            # unfinished row above: what scrolls off cannot be redrawn. And the panel takes at most half
            # the screen, so the reply stays in view: with 12 position rows it filled 21 of a 24-row
            # terminal's rows, leaving one for the reply streaming above it.
            room = min(console.height - 1 - bool(self._unfinished), console.height // 2)
            # A column short of the screen: a line that fills the last column leaves a terminal's cursor
            # pending a wrap, and a live region erased from there may leave a line behind (a panel's top
            # border was seen once in a scrollback at 80 columns, with the panel 80 wide: a precaution).
            yield stats_panel(self._stats, self._target_token_seconds, "live", max_height=room, width=options.max_width - 1)

    def add(self, text: str, source: Source) -> None:
        self._unfinished.append(text.translate(_CONTROL_PICTURES), PROVENANCE_STYLES[source] if self._provenance else "")
        self._refresh_now_and_then()

    def update(self, stats: RunStats) -> None:
        self._stats = stats
        self._refresh_now_and_then()

    def _refresh_now_and_then(self) -> None:
        now = time.perf_counter()
        if now - self._last_refresh < 1 / REFRESH_HZ:
            return
        self._last_refresh = now
        if not self._print_finished_rows():
            self._live.refresh()

    def _print_finished_rows(self) -> bool:
        """Print every row of the reply but the last for good; False where there is none."""
        rows = self._unfinished.wrap(self._console, self._console.width)
        if len(rows) < 2:
            return False
        # The live region is redrawn during the print, so it must already hold only the last row.
        self._unfinished = rows[-1]
        self._live.console.print(Text("\n").join(rows[:-1]))
        return True


class PlainReply:
    """The reply text as it comes, unstyled, to a pipe or file."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._written = False

    def __enter__(self) -> PlainReply:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *exc_info: object) -> None:
        if error_type is not None and not self._written:  # a reply that failed before its first text: no line
            return
        self._out.write("\n")
        self._out.flush()

    def add(self, text: str, source: Source) -> None:
        if text:
            self._out.write(text)
            self._out.flush()
            self._written = True

    def update(self, stats: RunStats) -> None:
        pass


class SilentReply(PlainReply):
    """JSON mode: the text is reported whole in the reply's JSON object."""

    def __exit__(self, *exc_info: object) -> None:
        pass

    def add(self, text: str, source: Source) -> None:
        pass


# --- everything chat prints, by mode --------------------------------------------------------------


class Display:
    def __init__(self, mode: Mode, *, provenance: bool, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.mode = mode
        self.provenance = provenance
        self._out = out or sys.stdout
        self.console = Console(file=self._out, highlight=False)
        # soft_wrap: a notice in a pipe or log stays one line, whatever width rich assumes.
        self.err_console = Console(file=err or sys.stderr, highlight=False, soft_wrap=True)
        # Notices share the terminal with the reply; with a pipe they must stay out of stdout.
        self._notices = self.console if mode == "terminal" else self.err_console

    def notice(self, message: str) -> None:
        self._notices.print(Text(message, style="dim"))

    def warning(self, message: str) -> None:
        self.err_console.print(Text(message, style="yellow" if self.mode == "terminal" else ""))

    def error(self, message: str) -> None:
        self.err_console.print(Text(f"error: {message}", style="red" if self.mode == "terminal" else ""))

    def legend(self) -> None:
        if self.mode == "terminal" and self.provenance:
            self.console.print(provenance_legend())

    def echo_user(self, text: str) -> None:
        """Show a message read from piped stdin, so a terminal transcript reads as a conversation."""
        if self.mode == "terminal":
            self.console.print(Text(f"> {text}", style="bold"))

    def reply(self, target_token_seconds: float | None) -> LiveReply | PlainReply:
        if self.mode == "terminal":
            return LiveReply(self.console, provenance=self.provenance, target_token_seconds=target_token_seconds)
        return PlainReply(self._out) if self.mode == "plain" else SilentReply(self._out)

    def reply_done(self, record: dict, stats: RunStats, target_token_seconds: float | None) -> None:
        """After each reply: a compact summary line, or the whole record as one JSON line."""
        if self.mode == "json":
            print(json.dumps(record | {"stats": stats_record(stats, target_token_seconds)}), file=self._out, flush=True)
        else:
            self.notice(f"[{summary_line(stats, target_token_seconds)}]")

    def session_stats(self, stats: RunStats, target_token_seconds: float | None, title: str) -> None:
        if self.mode == "terminal":
            self.console.print(stats_panel(stats, target_token_seconds, title, width=self.console.width))
        elif self.mode == "json":
            record = {"session": stats_record(stats, target_token_seconds)}
            print(json.dumps(record), file=self._out, flush=True)
        else:
            self.err_console.print(f"{title}: {summary_line(stats, target_token_seconds)}")
