"""llama.cpp's native library, loaded before numpy's.

With a GPU backend, a model load crashed where numpy had been imported first (docs/gpu.md, "GPU
figures"). `speccli/__init__.py` calls this before anything else. It loads the library alone, not the
llama_cpp module: the command line still checks its options without it.
"""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

_NAMES = ("libllama.so", "libllama.dylib", "llama.dll")


def load_llama_library_first() -> None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the command that needs it says so
    library_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    for name in _NAMES:
        if (library_dir / name).exists():
            try:
                ctypes.CDLL(str(library_dir / name))  # the mode llama_cpp loads it with
            except OSError:
                pass  # importing llama_cpp will name what is wrong
            return
