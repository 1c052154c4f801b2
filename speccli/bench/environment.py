"""What a bench ran on: the machine and versions, and each model file's size and (cached) sha256."""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from speccli import __version__
from speccli.bench.report import Environment, ModelFile
from speccli.llama.build import backend_info
from speccli.models.registry import build_atomically, model_cache_dir, sha256_of


def model_file(name: str, path: Path) -> ModelFile:
    return ModelFile(name=name, path=str(path), size_bytes=path.stat().st_size, sha256=cached_sha256(path))


def _sha_cache_file() -> Path:
    return model_cache_dir().parent / "sha256-cache.json"


def cached_sha256(path: Path) -> str:
    """sha256 of a file, remembered by (resolved path, size, mtime) so a 1 GB model is hashed once."""
    resolved = path.resolve()
    stat = resolved.stat()
    key = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_file = _sha_cache_file()
    try:
        cache = json.loads(cache_file.read_text())
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache.get(key), str):
        return cache[key]
    digest = sha256_of(resolved)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{resolved}|")}
    cache[key] = digest
    try:
        build_atomically(cache_file, lambda partial: partial.write_text(json.dumps(cache, indent=1), encoding="utf-8"))
    except OSError:
        pass  # a cache we cannot write only costs the hash next time
    return digest


def environment(threads: int | None, target_layers: int, draft_layers: int) -> Environment:
    info = backend_info()
    return Environment(
        speccli=__version__,
        python=sys.version.split()[0],
        platform=platform.platform(),
        llama_cpp_python=info.llama_cpp_python_version,
        backend=info.backend,
        gpu_offload_supported=info.gpu_offload,
        system_info=info.system_info,
        cpu_count=os.cpu_count() or 1,
        threads=threads or os.cpu_count() or 1,
        target_n_gpu_layers=target_layers,
        draft_n_gpu_layers=draft_layers,
    )
