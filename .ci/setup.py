#!/usr/bin/env python3
"""Set up speccli in ./.venv: a llama-cpp-python build that works on this machine, then speccli itself.

    python3 .ci/setup.py          # runtime install
    python3 .ci/setup.py --dev    # plus the test tools

llama-cpp-python ships only as source, and the build flags matter: on x86-64 CPUs with AMX a default
(native) build segfaults in ggml_backend_amx_mul_mat on the first decode. pip's wheel cache does not
key on CMAKE_ARGS, so a wheel built with other flags would be reused silently. This script therefore
builds the wheel once per (version, flags, Python, platform) into its own cache, and installs from
there: later runs and CI on the same machine take seconds.

Flags, in order of precedence: the user's CMAKE_ARGS; CUDA where nvcc and an NVIDIA GPU are present;
llama-cpp-python's default on macOS (Metal); on other x86-64 Linux, GGML_NATIVE=OFF with the
instruction sets this CPU reports (AVX .. AVX-512 VNNI, never AMX); the default elsewhere. Standard library only: it runs before anything is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # keep equal to the pin in pyproject.toml
# x86-64 instruction sets llama.cpp can be built for, by /proc/cpuinfo flag. AMX is left out on
# purpose: the native build's AMX path is what crashes.
X86_64_FEATURES = [
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("avx512f", "GGML_AVX512"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
]
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BUILD_MARKER = VENV / "speccli-llama-build.txt"


def say(message: str) -> None:
    print(f"[setup] {message}", flush=True)


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> None:
    subprocess.run([str(c) for c in cmd], check=True, env=env)


def has_nvidia_gpu() -> bool:
    if not shutil.which("nvcc") or not shutil.which("nvidia-smi"):
        return False
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return probe.returncode == 0 and "GPU" in probe.stdout


def choose_cmake_args() -> tuple[str, str]:
    """Return (CMAKE_ARGS, why)."""
    if "CMAKE_ARGS" in os.environ:
        return os.environ["CMAKE_ARGS"], "from your CMAKE_ARGS"
    if sys.platform == "darwin":
        return "", "llama-cpp-python's default for macOS (Metal on Apple silicon)"
    if has_nvidia_gpu():
        return "-DGGML_CUDA=on", "CUDA: nvcc and an NVIDIA GPU were found"
    if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
        return x86_64_flags(), "this CPU's instruction sets without AMX (a native build crashes on AMX CPUs)"
    return "", "llama-cpp-python's default"


def x86_64_flags() -> str:
    """GGML_NATIVE=OFF with each instruction set this CPU reports switched on: what -march=native
    would use, minus AMX. A wheel built so never uses an instruction the CPU lacks."""
    cpu_flags: set[str] = set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                cpu_flags = set(line.split(":", 1)[1].split())
                break
    switches = [f"-D{option}=ON" for flag, option in X86_64_FEATURES if flag in cpu_flags]
    return " ".join(["-DGGML_NATIVE=OFF", *switches])


def wheel_cache_root() -> Path:
    if "SPECCLI_WHEEL_CACHE" in os.environ:
        return Path(os.environ["SPECCLI_WHEEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "speccli" / "wheels"


def build_key(cmake_args: str) -> str:
    identity = "|".join(
        [LLAMA_CPP_PYTHON_VERSION, cmake_args, sys.implementation.cache_tag, sys.platform, platform.machine()]
    )
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def cached_wheel(cmake_args: str, venv_python: Path) -> Path:
    """The wheel for these flags, built on first use. A build is moved into place only when complete."""
    slot = wheel_cache_root() / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-{build_key(cmake_args)}"
    wheels = sorted(slot.glob("llama_cpp_python-*.whl")) if slot.is_dir() else []
    if wheels:
        say(f"using cached llama-cpp-python wheel {wheels[0]}")
        return wheels[0]
    say(f"building llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} (several minutes on 2 cores)")
    slot.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=slot.name + ".partial-", dir=slot.parent))
    env = dict(os.environ, CMAKE_ARGS=cmake_args)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    try:
        run(venv_python, "-m", "pip", "wheel", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            "--no-deps", "--no-cache-dir", "--wheel-dir", staging, env=env)
        (staging / "CMAKE_ARGS.txt").write_text(cmake_args + "\n")
        staging.rename(slot)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(slot.glob("llama_cpp_python-*.whl"))[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", action="store_true", help="also install the test dependencies")
    args = parser.parse_args()
    if sys.version_info < (3, 11):
        say(f"speccli needs Python 3.11 or newer; this is {platform.python_version()}")
        return 1

    venv_python = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not venv_python.exists():
        say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
        run(venv_python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")

    cmake_args, why = choose_cmake_args()
    say(f"llama.cpp build flags: {cmake_args or '(default)'} -- {why}")
    wheel = cached_wheel(cmake_args, venv_python)
    installed_from = BUILD_MARKER.read_text().strip() if BUILD_MARKER.exists() else None
    if installed_from != str(wheel):
        run(venv_python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", wheel)
        BUILD_MARKER.write_text(f"{wheel}\n")

    target = f"{ROOT}[dev]" if args.dev else str(ROOT)
    run(venv_python, "-m", "pip", "install", "--quiet", "--editable", target)
    say(f"ready: {VENV / 'bin' / 'speccli'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
