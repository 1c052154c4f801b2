"""llama.cpp's native library, loaded before numpy's.

With a GPU backend, a model load crashed where numpy had been imported first (docs/gpu.md, "GPU
figures"). `speccli/__init__.py` calls this before anything else. It loads the library alone, not the
llama_cpp module: the command line still checks its options without it. A script that imported numpy
before speccli is warned where the build has a backend that crash was reported for: a crash in native
code gives no Python error to read.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import warnings
from pathlib import Path

_NAMES = ("libllama.so", "libllama.dylib", "llama.dll")
# Backends the crash with numpy first was seen or reported for (llama-cpp-python #1581, #1903).
_CRASHING_BACKENDS = {"cuda": "CUDA", "vulkan": "Vulkan"}


def load_llama_library_first() -> None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the command that needs it says so
    # llama_cpp's own rule: LLAMA_CPP_LIB_PATH, else the package's lib folder.
    library_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(next(iter(spec.submodule_search_locations))) / "lib")
    if "numpy" in sys.modules and "llama_cpp" not in sys.modules and (backend := crashing_backend(library_dir)):
        warnings.warn(
            f"numpy was imported before speccli: with llama.cpp's {backend} backend a model load may crash "
            "(SIGSEGV); import speccli (or llama_cpp) before numpy (speccli's docs/gpu.md)",
            RuntimeWarning, stacklevel=2,
        )
    for name in _NAMES:
        if (library_dir / name).exists():
            try:
                ctypes.CDLL(str(library_dir / name))  # the mode llama_cpp loads it with
            except OSError:
                pass  # importing llama_cpp will name what is wrong
            return


def crashing_backend(library_dir: Path) -> str | None:
    """The name of a backend in `library_dir` (llama_cpp's libraries) that crashes with numpy loaded first."""
    for stem, name in _CRASHING_BACKENDS.items():
        if any(library_dir.glob(f"*ggml-{stem}.*")):
            return name
    return None
