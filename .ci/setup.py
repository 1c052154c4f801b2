#!/usr/bin/env python3
"""Set up speccli in ./.venv: a llama-cpp-python build that works on this machine, then speccli itself.

    python3 .ci/setup.py          # runtime install
    python3 .ci/setup.py --dev    # plus the test tools
    python3 .ci/setup.py --cuda   # a CUDA build even without a GPU here (a compile test)
    python3 .ci/setup.py --llama-cpp DIR   # llama.cpp built once into DIR: its libraries and its tools

llama-cpp-python ships only as source, and the build flags matter: on x86-64 CPUs with AMX a default
(native) build segfaults in ggml_backend_amx_mul_mat on the first decode. pip's wheel cache does not
key on CMAKE_ARGS, so a wheel built with other flags would be reused silently. This script therefore
builds the wheel once per (version, flags, Python, platform) into its own cache, and installs from
there: later runs and CI on the same machine take seconds.

Flags, in order of precedence: the user's CMAKE_ARGS; CUDA where nvcc and an NVIDIA GPU are present (or --cuda);
llama-cpp-python's default on macOS (Metal); on other x86-64 Linux, GGML_NATIVE=OFF with the
instruction sets this CPU reports (AVX .. AVX-512 VNNI, never AMX); the default elsewhere. Each
set gets GGML_RPC=ON (the RPC client and server) unless the user's CMAKE_ARGS name GGML_RPC. Standard library only: it runs before anything is installed.

`--llama-cpp DIR` builds the llama.cpp that llama-cpp-python vendors once, with the same flags, into DIR:
its shared libraries and llama.cpp's own tools (TOOLS, for side-by-side benchmarks), and installs
llama-cpp-python without a library of its own (-DLLAMA_BUILD=OFF), to be pointed at DIR/build/bin with
LLAMA_CPP_LIB_PATH. So a CUDA machine compiles ggml-cuda once for both (the device check does this).

The CUDA build needs cuBLAS, which a toolkit assembled from NVIDIA's pip packages lacks. Where the
toolkit has none, cuBLAS comes from an installed nvidia-cublas package of this Python, else from that
wheel fetched with `pip install --target` into speccli's cache. A toolkit root is then assembled in the
cache (links to the real toolkit's files, overlaid with cuBLAS) and handed to CMake as CUDAToolkit_ROOT.
The built libraries get that root's lib64 in their RUNPATH, so the wheel runs on the machine that built it.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import venv
from pathlib import Path
from typing import NamedTuple

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
# Oldest CUDA release llama.cpp names as tested (CUDART_HMAX in ggml-cuda/common.cuh, its build docs).
MIN_NVCC_VERSION = (11, 7)
# Where a CUDA toolkit keeps headers and libraries: CMake's FindCUDAToolkit looks in both.
TOOLKIT_INCLUDE_DIRS = ("include", "targets/x86_64-linux/include")
TOOLKIT_LIB_DIRS = ("lib64", "lib", "targets/x86_64-linux/lib")
# The compute capability of a CUDA build when no GPU is here to ask (--cuda): Hopper (H100, H200).
DEFAULT_CUDA_ARCH = "90"
# Written last into an assembled toolkit root: a root without it is not used.
TOOLKIT_COMPLETE_MARKER = "speccli-toolkit-complete"
# llama.cpp's own programs that --llama-cpp builds beside the libraries: the target alone, its two
# speculative loops and its server.
TOOLS = ["llama-completion", "llama-speculative-simple", "llama-speculative", "llama-server"]
# What the tools need and nothing that reaches the network at build or run time (the web UI from a
# bucket, curl, OpenSSL).
TOOLS_CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON "
                    "-DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF "
                    "-DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF")
NO_LIBRARY = "-DLLAMA_BUILD=OFF"  # llama-cpp-python's flag: the Python package alone
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
BUILD_MARKER = VENV / "speccli-llama-build.txt"


def say(message: str) -> None:
    print(f"[setup] {message}", flush=True)


class SetupError(Exception):
    """Something the build needs cannot be found or made; the message says what, in one line."""


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> None:
    subprocess.run([str(c) for c in cmd], check=True, env=env)


def gpu_compute_capabilities() -> list[str]:
    """The compute capabilities of this machine's NVIDIA GPUs as CMake spells them ("9.0" -> "90"),
    distinct and sorted; empty where nvidia-smi is missing or finds no GPU."""
    if not shutil.which("nvidia-smi"):
        return []
    probe = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return []
    return sorted({line.strip().replace(".", "") for line in probe.stdout.splitlines() if line.strip()})


def choose_cmake_args(force_cuda: bool = False, cuda_arch: str | None = None,
                      pip_python: Path | None = None, cublas_search_path: list[str] | None = None) -> tuple[str, str]:
    """Return (CMAKE_ARGS, why). force_cuda builds for CUDA without a GPU here; cuda_arch overrides
    the architectures the GPUs report; pip_python fetches cuBLAS if need be (default: this Python);
    cublas_search_path is where installed packages are looked for (default: sys.path)."""
    if "CMAKE_ARGS" in os.environ:
        return os.environ["CMAKE_ARGS"], "from your CMAKE_ARGS"
    nvcc = shutil.which("nvcc")
    gpu_archs = gpu_compute_capabilities() if nvcc else []
    if force_cuda or gpu_archs:
        if not nvcc:
            raise SetupError("--cuda needs nvcc, the CUDA compiler, on PATH; none was found")
        archs = cuda_arch or ";".join(gpu_archs) or DEFAULT_CUDA_ARCH
        why = (f"CUDA for the GPUs here (compute capability {archs.replace(';', ', ')})" if gpu_archs and not cuda_arch
               else f"CUDA, forced by --cuda, for compute capability {archs}")
        cmake_args = cuda_cmake_args(Path(nvcc), archs, pip_python or Path(sys.executable),
                                     sys.path if cublas_search_path is None else cublas_search_path)
        if is_linux_x86_64():
            # The CPU backend is built too, and its native build crashes on AMX CPUs (the lent H200's has AMX).
            cmake_args = f"{x86_64_flags()} {cmake_args}"
        return cmake_args, why
    if sys.platform == "darwin":
        return "", "llama-cpp-python's default for macOS (Metal on Apple silicon)"
    if is_linux_x86_64():
        return x86_64_flags(), "this CPU's instruction sets without AMX (a native build crashes on AMX CPUs)"
    return "", "llama-cpp-python's default"


def is_linux_x86_64() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def with_rpc(cmake_args: str) -> str:
    """Every build is an RPC client and server (`speccli rpc-server`, `--rpc`), unless the user's
    CMAKE_ARGS say otherwise about GGML_RPC."""
    return cmake_args if "GGML_RPC" in cmake_args else " ".join(filter(None, [cmake_args, "-DGGML_RPC=ON"]))


def cuda_cmake_args(nvcc: Path, archs: str, pip_python: Path, cublas_search_path: list[str]) -> str:
    """The flags of a CUDA build with nvcc, cuBLAS found or fetched, and the toolkit root assembled."""
    toolkit, version = nvcc_toolkit(nvcc)
    if version < MIN_NVCC_VERSION:
        raise SetupError(f"nvcc {nvcc} is CUDA {version[0]}.{version[1]}; llama.cpp needs CUDA "
                         f"{MIN_NVCC_VERSION[0]}.{MIN_NVCC_VERSION[1]} or newer")
    if toolkit_has_cublas(toolkit):
        cublas = None
    else:
        cublas = (find_cublas_package(cublas_search_path, version[0])
                  or fetch_cublas(version, pip_python, speccli_cache_root() / "cuda"))
        say(f"cuBLAS from {cublas.origin}")
    driver = find_driver_library(toolkit)
    root = prepare_toolkit_root(toolkit, cublas, driver, speccli_cache_root() / "cuda")
    flags = ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]
    if driver is None:
        # Without libcuda, ggml-cuda cannot link the driver API it uses for virtual memory management.
        flags.append("-DGGML_CUDA_NO_VMM=ON")
    # The libraries' RUNPATH is $ORIGIN alone: CMake leaves nvcc's own library directory (the root's
    # lib64) out of it, and cuBLAS from a package is on no loader path. A link flag puts it back.
    linker_flags = " ".join(filter(None, [os.environ.get("LDFLAGS", ""), f"-Wl,-rpath,{root / 'lib64'}"]))
    flags += [f"-DCUDAToolkit_ROOT={shlex.quote(str(root))}",
              f"-DCMAKE_CUDA_COMPILER={shlex.quote(str(root / 'bin' / 'nvcc'))}",
              shlex.quote(f"-DCMAKE_SHARED_LINKER_FLAGS={linker_flags}")]
    return " ".join(flags)


def nvcc_toolkit(nvcc: Path) -> tuple[Path, tuple[int, int]]:
    """The toolkit root nvcc belongs to (its TOP, which a wrapper script's path would not tell) and
    its CUDA version."""
    try:
        version_text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
        dry_run = subprocess.run([str(nvcc), "-v", "--dryrun", "-c", "speccli-probe.cu"],
                                 capture_output=True, text=True).stderr
    except (OSError, subprocess.CalledProcessError) as error:
        raise SetupError(f"nvcc {nvcc} does not run: {error}") from None
    release = re.search(r"release (\d+)\.(\d+)", version_text)
    top = re.search(r"^#\$ TOP=(.+)$", dry_run, re.MULTILINE)
    if not release or not top:
        raise SetupError(f"nvcc {nvcc} does not say its CUDA release and toolkit root (nvcc --version, nvcc -v --dryrun)")
    return Path(top.group(1).strip()).resolve(), (int(release.group(1)), int(release.group(2)))


def toolkit_has_cublas(toolkit: Path) -> bool:
    return (any((toolkit / d / "cublas_v2.h").is_file() for d in TOOLKIT_INCLUDE_DIRS)
            and any(any((toolkit / d).glob("libcublas.so*")) for d in TOOLKIT_LIB_DIRS))


class CublasFiles(NamedTuple):
    """The headers and shared libraries of an installed nvidia-cublas package."""

    origin: str
    headers: tuple[Path, ...]
    libraries: tuple[Path, ...]


def cublas_package_name(cuda_major: int) -> str:
    # From CUDA 13 on, NVIDIA's wheels drop the -cuNN suffix and put files under nvidia/cuNN/.
    return "nvidia-cublas" if cuda_major >= 13 else f"nvidia-cublas-cu{cuda_major}"


def find_cublas_package(search_path: list[str], cuda_major: int) -> CublasFiles | None:
    """cuBLAS for this CUDA major version from an nvidia-cublas package installed in search_path,
    by the files its RECORD lists; None if there is none."""
    wanted = {cublas_package_name(cuda_major), f"nvidia-cublas-cu{cuda_major}"}
    for dist in importlib.metadata.distributions(path=search_path):
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        if name not in wanted or not dist.files:
            continue
        files = [Path(dist.locate_file(f)) for f in dist.files]
        headers = tuple(f for f in files if f.parent.name == "include" and f.suffix == ".h" and f.is_file())
        libraries = tuple(f for f in files if f.parent.name == "lib" and ".so" in f.name and f.is_file())
        if any(h.name == "cublas_v2.h" for h in headers) and any(l.name == f"libcublas.so.{cuda_major}" for l in libraries):
            return CublasFiles(f"{dist.metadata['Name']} {dist.version} in {dist.locate_file('')}", headers, libraries)
    return None


def fetch_cublas(cuda_version: tuple[int, int], pip_python: Path, cache: Path) -> CublasFiles:
    """Install the nvidia-cublas wheel for this CUDA version into the cache with pip --target (once),
    never into an environment. Prefers the toolkit's own minor release, whose headers match its runtime."""
    major, minor = cuda_version
    package = cublas_package_name(major)
    for release, spec in ((f"{major}.{minor}", f"{package}=={major}.{minor}.*"),
                          (f"{major}.x", f"{package}>={major},<{major + 1}")):
        target = cache / f"{package}-{release}"
        if not target.is_dir():
            say(f"fetching {spec} into {target} (a few hundred MB, once)")
            cache.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=cache))
            fetched = subprocess.run([str(pip_python), "-m", "pip", "install", "--quiet", "--no-deps",
                                      "--target", str(staging), spec])
            if fetched.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                continue
            install_complete(staging, target)
        found = find_cublas_package([str(target)], major)
        if found:
            return found
    raise SetupError(f"cuBLAS is not in the CUDA toolkit, no {package} package is installed in this Python, "
                     f"and pip could not fetch {package} {major}.x (offline?)")


def find_driver_library(toolkit: Path) -> Path | None:
    """A CUDA driver library (libcuda.so*): the toolkit's own or stub, else the system's."""
    candidates = [toolkit / d / sub for d in TOOLKIT_LIB_DIRS for sub in ("", "stubs")]
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if Path(ldconfig).exists():
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
        candidates += [Path(m).parent for m in re.findall(r"libcuda\.so[.\d]* .*=> (\S+)", listing)]
    candidates += [Path(d) for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/wsl/lib")]
    for directory in candidates:
        found = sorted(directory.glob("libcuda.so*")) if directory.is_dir() else []
        if found:
            return found[0]
    return None


def toolkit_root_key(toolkit: Path, cublas: CublasFiles | None, driver: Path | None) -> str:
    """What the assembled root is made of: the toolkit, the cuBLAS files (path and size, so an
    upgraded package makes a new root) and the driver library."""
    parts = [str(toolkit), str(driver)]
    if cublas:
        parts += [f"{f.resolve()}:{f.stat().st_size}" for f in (*cublas.headers, *cublas.libraries)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def prepare_toolkit_root(toolkit: Path, cublas: CublasFiles | None, driver: Path | None, cache: Path) -> Path:
    """A toolkit root in the cache for CUDAToolkit_ROOT: links to the real toolkit's files, with the
    cuBLAS headers and libraries added to include/ and lib64/ (targets/x86_64-linux/{include,lib}
    and lib/ lead there too), every shared library reachable by its unversioned name, and a libcuda.so
    link where a driver library was found outside the toolkit. Assembled in a staging directory and
    renamed into place; an existing complete root is reused."""
    root = cache / f"toolkit-{toolkit_root_key(toolkit, cublas, driver)}"
    if (root / TOOLKIT_COMPLETE_MARKER).is_file():
        return root
    say(f"assembling a CUDA toolkit root with cuBLAS in {root}")
    if root.exists():  # no marker: not made by this function, or by an older one; remake it
        shutil.rmtree(root)
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=root.name + ".partial-", dir=cache))
    try:
        merged = {"include": (TOOLKIT_INCLUDE_DIRS, cublas.headers if cublas else ()),
                  "lib64": (TOOLKIT_LIB_DIRS, cublas.libraries if cublas else ())}
        for entry in toolkit.iterdir():
            if entry.name not in ("bin", "include", "lib", "lib64", "targets"):
                (staging / entry.name).symlink_to(entry)
        # A real bin/ of links: nvcc finds its toolkit as <the directory it was called from>/.., which
        # through a linked bin/ would be the real toolkit, without cuBLAS.
        link_all(staging / "bin", list((toolkit / "bin").iterdir()))
        for name, (toolkit_dirs, extra) in merged.items():
            link_all(staging / name, [e for d in toolkit_dirs if (toolkit / d).is_dir() for e in (toolkit / d).iterdir()])
            link_all(staging / name, list(extra))
        if driver is not None and not (staging / "lib64" / "libcuda.so").exists():
            (staging / "lib64" / "libcuda.so").symlink_to(driver)
        add_unversioned_links(staging / "lib64")
        (staging / "lib").symlink_to("lib64")
        (staging / "targets" / "x86_64-linux").mkdir(parents=True)
        (staging / "targets" / "x86_64-linux" / "include").symlink_to("../../include")
        (staging / "targets" / "x86_64-linux" / "lib").symlink_to("../../lib64")
        (staging / TOOLKIT_COMPLETE_MARKER).write_text(f"{toolkit}\n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    install_complete(staging, root)
    return root


def link_all(directory: Path, entries: list[Path]) -> None:
    """A link in directory to each entry, by its name; the first entry of a name wins (the toolkit's
    own files over a package's)."""
    directory.mkdir(exist_ok=True)
    for entry in entries:
        link = directory / entry.name
        if not link.is_symlink() and not link.exists():
            link.symlink_to(entry.resolve() if entry.is_symlink() else entry)


def add_unversioned_links(lib_dir: Path) -> None:
    """libX.so -> libX.so.N for each library present only by a versioned name: CMake's find_library
    and the linker look for the unversioned one."""
    for library in sorted(lib_dir.glob("lib*.so.*")):
        unversioned = lib_dir / (library.name.split(".so.", 1)[0] + ".so")
        if not unversioned.is_symlink() and not unversioned.exists():
            unversioned.symlink_to(library.name)


def install_complete(staging: Path, final: Path) -> None:
    """Rename a finished staging directory into place. If another run got there first, keep its copy."""
    try:
        staging.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(staging, ignore_errors=True)


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


def speccli_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "speccli"


def wheel_cache_root() -> Path:
    if "SPECCLI_WHEEL_CACHE" in os.environ:
        return Path(os.environ["SPECCLI_WHEEL_CACHE"])
    return speccli_cache_root() / "wheels"


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


def build_llama_cpp(cmake_args: str, build_dir: Path, venv_python: Path) -> Path:
    """llama.cpp's shared libraries and TOOLS built from llama-cpp-python's sdist (pip finds it where it
    finds packages: PyPI, or an offline bundle's PIP_FIND_LINKS) in build_dir; returns the folder holding
    both. The source is kept beside the build, so a build cut short goes on where it stopped when run
    again; a finished build of the same version and flags is reused, one of other flags started afresh."""
    marker = build_dir / "speccli-llama-cpp.txt"
    identity = f"{LLAMA_CPP_PYTHON_VERSION} {cmake_args} {TOOLS_CMAKE_ARGS}"
    source, binary = build_dir / "source", build_dir / "build"
    if marker.exists() and marker.read_text().strip() == identity:
        say(f"using llama.cpp built in {build_dir}")
        return binary / "bin"
    if (build_dir / "identity.txt").exists() and (build_dir / "identity.txt").read_text().strip() != identity:
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "identity.txt").write_text(identity + "\n")
    say(f"building llama.cpp {LLAMA_CPP_PYTHON_VERSION}'s libraries and {', '.join(TOOLS)} in {build_dir}")
    if not (source / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory(prefix="speccli-llama-sdist-") as scratch:
            run(venv_python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "--dest", scratch)
            with tarfile.open(next(Path(scratch).glob("llama_cpp_python-*.tar.gz"))) as archive:
                # The "data" filter (Python 3.11.4 and later) refuses links and paths that leave the folder.
                archive.extractall(scratch, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            shutil.move(next(Path(scratch).glob("llama_cpp_python-*/vendor/llama.cpp")), source)
    run("cmake", "-S", source, "-B", binary, *shlex.split(cmake_args), *shlex.split(TOOLS_CMAKE_ARGS))
    run("cmake", "--build", binary, "--parallel", str(os.cpu_count() or 2), "--target", "llama", *TOOLS)
    marker.write_text(identity + "\n")
    return binary / "bin"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", action="store_true", help="also install the test dependencies")
    parser.add_argument("--cuda", action="store_true",
                        help="build for CUDA even without an NVIDIA GPU here (needs nvcc)")
    parser.add_argument("--cuda-arch", metavar="CC",
                        help=f"CUDA compute capabilities to build for, as CMake spells them (90, or 80;90); "
                             f"default: the GPUs' here, else {DEFAULT_CUDA_ARCH}")
    parser.add_argument("--llama-cpp", metavar="DIR", type=Path,
                        help="build llama.cpp's libraries and its tools into DIR, for llama-cpp-python to load "
                             "with LLAMA_CPP_LIB_PATH=DIR/build/bin")
    args = parser.parse_args()
    if sys.version_info < (3, 11):
        say(f"speccli needs Python 3.11 or newer; this is {platform.python_version()}")
        return 1
    try:
        return set_up(args.dev, args.cuda or args.cuda_arch is not None, args.cuda_arch, args.llama_cpp)
    except SetupError as error:
        say(str(error))
        return 1
    except subprocess.CalledProcessError as error:
        say(f"{' '.join(map(str, error.cmd))} failed with exit status {error.returncode}; its output is above")
        return 1


def set_up(dev: bool, force_cuda: bool, cuda_arch: str | None, llama_cpp: Path | None = None) -> int:
    venv_python = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not venv_python.exists():
        say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
        run(venv_python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")

    cmake_args, why = choose_cmake_args(force_cuda, cuda_arch, pip_python=venv_python)
    cmake_args = with_rpc(cmake_args)
    say(f"llama.cpp build flags: {cmake_args or '(default)'} -- {why}")
    if llama_cpp is not None:
        library_dir = build_llama_cpp(cmake_args, llama_cpp.resolve(), venv_python)
        cmake_args = NO_LIBRARY
    wheel = cached_wheel(cmake_args, venv_python)
    installed_from = BUILD_MARKER.read_text().strip() if BUILD_MARKER.exists() else None
    if installed_from != str(wheel):
        run(venv_python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", wheel)
        BUILD_MARKER.write_text(f"{wheel}\n")

    target = f"{ROOT}[dev]" if dev else str(ROOT)
    run(venv_python, "-m", "pip", "install", "--quiet", "--editable", target)
    say(f"ready: {VENV / 'bin' / 'speccli'}")
    if llama_cpp is not None:
        say(f"llama.cpp's libraries and tools are in {library_dir}: run speccli with LLAMA_CPP_LIB_PATH={library_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
