"""Re-encode a GGUF file with llama.cpp's quantizer (how derived models are built)."""
from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from pathlib import Path

import llama_cpp

from speccli.errors import SpeccliError
from speccli.llama.log import clear_errors, init_backend, last_llama_error
from speccli.util.interrupts import ctrl_c_as_flag, exit_code_for_interrupt

# llama.cpp's file types that `quantize_model` can write, by the names llama.cpp's tools use.
FILE_TYPES = {
    "F32": llama_cpp.LLAMA_FTYPE_ALL_F32,
    "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "BF16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q2_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
}


def quantize_model(source: Path, dest: Path, file_type: str) -> None:
    """Write `source` re-encoded as `file_type` (e.g. upcast Q4_K_M to F32) to `dest`, not atomically."""
    init_backend()
    if file_type not in FILE_TYPES:
        raise SpeccliError(f"unknown file type {file_type!r}; known: {', '.join(FILE_TYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.allow_requantize = True  # the source is already quantized: dequantize, then re-encode
    params.nthread = os.cpu_count() or 1
    clear_errors()
    # llama.cpp's quantizer cannot be cancelled, and Python runs a Ctrl-C handler only between Python
    # instructions: inside this one long call it would wait for the end (or be lost in the log
    # callback). So the call runs on a worker thread while this thread waits and watches for Ctrl-C;
    # on one it raises at once, the caller's atomic build removes the unfinished file, and the worker
    # ends with the process. The process must end before the interpreter is torn down around the
    # worker: llama.cpp logs through a Python callback, and a call into a finalizing interpreter
    # crashed the process (SIGSEGV instead of exit 130, about 1 interrupted build in 5).
    outcome: list[int] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            llama_cpp.llama_model_quantize(os.fsencode(source), os.fsencode(dest), ctypes.byref(params))
        ),
        daemon=True,
    )
    with ctrl_c_as_flag() as interrupted:
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            if interrupted():
                atexit.register(_exit_before_finalizing, exit_code_for_interrupt())  # runs first: registered last
                raise KeyboardInterrupt
    status = outcome[0] if outcome else -1
    if status != 0:
        raise SpeccliError(f"{source}: llama.cpp could not convert it to {file_type}{last_llama_error()}")


def _exit_before_finalizing(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)
