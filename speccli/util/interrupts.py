"""Ctrl-C as a flag, for code that must not be interrupted half-way through a step; and SIGTERM
(`kill`, `timeout`, a service manager) handled as a Ctrl-C that also ends the process."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from speccli.errors import INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE


_terminated = threading.Event()


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so that the same clean-up
    runs (a build's temporary file removed, models freed) where Python's default would end the process
    at once; `exit_code_for_interrupt` then gives 143, not 130. The previous handler comes back after
    (a test calling the CLI in-process keeps its own). Only the main thread can set a handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _terminated.clear()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _on_sigterm(_signum: int, _frame: object) -> None:
    _terminated.set()
    raise KeyboardInterrupt


def terminated() -> bool:
    """Whether SIGTERM has arrived since `sigterm_unwinds` began (or within a `ctrl_c_as_flag` block)."""
    return _terminated.is_set()


def exit_code_for_interrupt() -> int:
    return TERMINATED_EXIT_CODE if terminated() else INTERRUPTED_EXIT_CODE


@contextmanager
def ctrl_c_as_flag() -> Iterator[Callable[[], bool]]:
    """While the block runs, Ctrl-C (SIGINT) only sets a flag, read with the function yielded; the
    previous handler comes back afterwards. SIGTERM sets the flag too, and then, since it asks the
    process to end rather than a step to stop, raises KeyboardInterrupt as the block ends. Off the
    main thread, where Python delivers no signals, the flag is simply never set."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested.is_set
        return

    def on_sigterm(_signum: int, _frame: object) -> None:
        _terminated.set()
        requested.set()

    previous_int = signal.signal(signal.SIGINT, lambda *_: requested.set())
    previous_term = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield requested.is_set
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    if terminated():
        raise KeyboardInterrupt
