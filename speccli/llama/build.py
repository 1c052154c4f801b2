"""What this build of llama.cpp can do: backend, GPU offload, instruction sets."""
from __future__ import annotations

import re
from dataclasses import dataclass

import llama_cpp

from speccli.llama.log import init_backend

@dataclass(frozen=True)
class BackendInfo:
    llama_cpp_python_version: str
    backend: str  # "CPU", "CUDA", "Metal", ...
    gpu_offload: bool
    system_info: str

    @property
    def summary(self) -> str:
        offload = "GPU offload supported" if self.gpu_offload else "no GPU offload"
        return f"{self.backend}, {offload}"


def backend_info() -> BackendInfo:
    init_backend()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    gpu_backends = [name for name in ("CUDA", "Metal", "Vulkan", "SYCL", "HIP", "OpenCL") if name in system_info]
    return BackendInfo(
        llama_cpp_python_version=llama_cpp.__version__,
        backend=" + ".join(gpu_backends + ["CPU"]),
        gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
        system_info=re.sub(r"\s+", " ", system_info),
    )

