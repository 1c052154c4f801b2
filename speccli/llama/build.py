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
    local_gpu: bool  # a GPU here that layers can go to
    rpc_offload: bool  # layers can go to RPC servers
    system_info: str

    @property
    def offload(self) -> str:
        return "supported" if self.local_gpu else "to RPC servers only: no GPU here" if self.rpc_offload else "not supported"

    @property
    def summary(self) -> str:
        return f"{self.backend}, GPU offload {self.offload}"


def backend_info() -> BackendInfo:
    from speccli.llama import rpc

    init_backend()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    gpu_backends = [name for name in ("CUDA", "Metal", "Vulkan", "SYCL", "HIP", "OpenCL") if name in system_info]
    return BackendInfo(
        llama_cpp_python_version=llama_cpp.__version__,
        backend=" + ".join(gpu_backends + ["CPU"]),
        # llama.cpp reports offload as supported wherever its RPC backend is built in, GPU or none.
        local_gpu=any(device.is_local_accelerator for device in rpc.devices()),
        rpc_offload=bool(llama_cpp.llama_supports_gpu_offload()),
        system_info=re.sub(r"\s+", " ", system_info),
    )

