"""What a bench ran on: the machine and versions, and each model file's size and (cached) sha256."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from speccli import __version__
from speccli.bench.report import Environment, ModelFile
from speccli.llama.build import backend_info
from speccli.llama.model import Model
from speccli.util.hashing import cached_sha256


def model_file(name: str, path: Path) -> ModelFile:
    return ModelFile(name=name, path=str(path), size_bytes=path.stat().st_size, sha256=cached_sha256(path))


def environment(threads: int | None, target: Model, draft: Model | None) -> Environment:
    info = backend_info()
    return Environment(
        speccli=__version__,
        python=sys.version.split()[0],
        platform=platform.platform(),
        llama_cpp_python=info.llama_cpp_python_version,
        backend=info.backend,
        # layers can leave the CPU: to a GPU here, or to the RPC servers the run was given
        gpu_offload_supported=info.local_gpu or "RPC" in target.placement or "RPC" in (draft.placement if draft else ""),
        system_info=info.system_info,
        cpu_count=os.cpu_count() or 1,
        threads=threads or os.cpu_count() or 1,
        target_n_gpu_layers=target.options.n_gpu_layers,
        draft_n_gpu_layers=draft.options.n_gpu_layers if draft is not None else None,
        target_runs_on=target.placement,
        draft_runs_on=draft.placement if draft is not None else None,
    )
