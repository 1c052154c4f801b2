"""llama.cpp's process-wide set-up and its log: kept quiet, but its errors go into our messages.

`init_backend` runs once before anything else touches llama.cpp; `last_llama_error` gives the first
error line llama.cpp logged since `clear_errors`, which is usually the cause of a failed call.
"""
from __future__ import annotations

import ctypes
import os
import sys
from collections import deque

import llama_cpp

_recent_errors: deque[str] = deque(maxlen=20)
_GGML_LOG_LEVEL_ERROR = 4  # ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_GGML_LOG_LEVEL_CONT = 5  # continues the previous message, at that message's level
_last_level = 0


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    global _last_level
    line = text.decode("utf-8", errors="replace")
    if os.environ.get("SPECCLI_LLAMA_LOG"):
        print(line, end="", flush=True, file=sys.stderr)
    if level != _GGML_LOG_LEVEL_CONT:
        _last_level = level
    if _last_level == _GGML_LOG_LEVEL_ERROR and line.strip():
        _recent_errors.append(line.strip())


_backend_ready = False


def init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def last_llama_error() -> str:
    """llama.cpp's first error line since the call began, the cause; the later ones only pass it on.
    (`_recent_errors` is cleared before each call.)"""
    return f" (llama.cpp: {_recent_errors[0]})" if _recent_errors else ""



def clear_errors() -> None:
    """Forget earlier errors: call before each llama.cpp call whose failure is to be explained."""
    _recent_errors.clear()
