"""Ctrl-C as a flag: for code that must not be interrupted half-way through a step."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def ctrl_c_as_flag() -> Iterator[Callable[[], bool]]:
    """While the block runs, Ctrl-C (SIGINT) only sets a flag, read with the function yielded; the
    previous handler comes back afterwards. Off the main thread, where Python delivers no signals,
    the flag is simply never set."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested.is_set
        return
    previous = signal.signal(signal.SIGINT, lambda *_: requested.set())
    try:
        yield requested.is_set
    finally:
        signal.signal(signal.SIGINT, previous)
