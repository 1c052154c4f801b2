"""Gemma 3 270M test files for quant-check, built once per reference and cached across runs (and CI).

From the F32 reference: Q8_0, Q4_K_M and Q2_K written by llama.cpp's quantizer, and a deliberately
broken file: the Q8_0 file with every weight of BROKEN_LAYERS zeroed in place through `gguf`
(the layers then add nothing to the residual stream; the file still loads and runs).
Cached under ~/.cache/speccli/test-data/quant-check/<first 16 hex of the reference's sha256>/.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from gguf import GGUFReader

from speccli.llama.quantize import quantize_model
from speccli.models.config import load_registry
from speccli.models.resolve import resolve_model
from speccli.util.files import build_atomically
from speccli.util.hashing import sha256_of

REFERENCE_NAME = "gemma3-270m-f32"
QUANT_TYPES = ("Q8_0", "Q4_K_M", "Q2_K")
BROKEN_LAYERS = (4, 5)


def reference_file() -> Path:
    return resolve_model(REFERENCE_NAME, load_registry(), quiet=True)


def build_test_files(reference: Path) -> dict[str, Path]:
    """{"Q8_0": path, "Q4_K_M": path, "Q2_K": path, "broken": path}, built if not cached."""
    directory = Path.home() / ".cache" / "speccli" / "test-data" / "quant-check" / sha256_of(reference)[:16]
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for file_type in QUANT_TYPES:
        dest = directory / f"{file_type}.gguf"
        if not dest.exists():
            build_atomically(dest, lambda tmp, t=file_type: quantize_model(reference, tmp, t))
        files[file_type] = dest
    broken = directory / "broken.gguf"
    if not broken.exists():
        build_atomically(broken, lambda tmp: _write_broken(files["Q8_0"], tmp))
    files["broken"] = broken
    return files


def _write_broken(source: Path, dest: Path) -> None:
    shutil.copyfile(source, dest)
    reader = GGUFReader(dest, "r+")
    prefixes = tuple(f"blk.{layer}." for layer in BROKEN_LAYERS)
    zeroed = 0
    for tensor in reader.tensors:
        if tensor.name.startswith(prefixes) and tensor.name.endswith(".weight") and "norm" not in tensor.name:
            tensor.data[...] = np.zeros((), dtype=tensor.data.dtype)
            zeroed += 1
    if not zeroed:
        raise AssertionError(f"{source}: no tensors of layers {BROKEN_LAYERS}")
    reader.data.flush()
