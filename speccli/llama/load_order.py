"""llama.cpp's native library, loaded before numpy's.

With a GPU backend, loading a model crashed where numpy had been imported before llama.cpp's library
was loaded: on the lent H200, speccli's Model crashed in llama_model_load_from_file while the same
load with llama_cpp imported first ran (docs/gpu.md); llama-cpp-python's issues #1581 and #1903 report
the same with CUDA and Vulkan builds, pandas or numpy imported first. `speccli/__init__.py` calls this
before anything else, so that every speccli process loads them in the order that works. It loads the
library alone, not the llama_cpp module: the command line still checks its options without it.
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
