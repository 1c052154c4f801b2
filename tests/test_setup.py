""".ci/setup.py's choice of build flags and its CUDA toolkit root, without compiling anything.

The CUDA tests use the real nvcc and toolkit where this machine has one (they skip otherwise) and a
small stand-in for the nvidia-cublas package: the real wheel is over 400 MB. The one stand-in for
hardware is a scripted nvidia-smi, since no GPU is here to answer.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import stat
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

SETUP_PY = Path(__file__).resolve().parent.parent / ".ci" / "setup.py"


def load_setup() -> ModuleType:
    spec = importlib.util.spec_from_file_location("speccli_ci_setup", SETUP_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


setup = load_setup()
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc, the CUDA compiler, on PATH")


@pytest.fixture
def toolkit() -> tuple[Path, tuple[int, int]]:
    """The real CUDA toolkit nvcc belongs to, and its version; skips where it already has cuBLAS
    (then nothing is overlaid)."""
    if NVCC is None:
        pytest.skip("needs nvcc, the CUDA compiler, on PATH")
    root, version = setup.nvcc_toolkit(Path(NVCC))
    if setup.toolkit_has_cublas(root):
        pytest.skip(f"the toolkit in {root} has cuBLAS already")
    return root, version


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """speccli's cache (cuBLAS, toolkit roots, wheels) in a temporary directory; no CMAKE_ARGS or LDFLAGS."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECCLI_WHEEL_CACHE", raising=False)
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    monkeypatch.delenv("LDFLAGS", raising=False)
    return tmp_path / "cache" / "speccli"


def fake_cublas_package(site: Path, cuda_major: int) -> Path:
    """An installed nvidia-cublas as pip lays it out (files under nvidia/cuNN/, listed in RECORD),
    with tiny files in place of the real headers and libraries. Returns its lib directory."""
    package = setup.cublas_package_name(cuda_major)
    files = [f"nvidia/cu{cuda_major}/include/cublas_v2.h", f"nvidia/cu{cuda_major}/include/cublas_api.h",
             f"nvidia/cu{cuda_major}/lib/libcublas.so.{cuda_major}", f"nvidia/cu{cuda_major}/lib/libcublasLt.so.{cuda_major}"]
    for name in files:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(f"stand-in for {name}\n")
    dist_info = site / f"{package.replace('-', '_')}-{cuda_major}.0.2.14.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {cuda_major}.0.2.14\n")
    record = [*files, f"{dist_info.name}/METADATA", f"{dist_info.name}/RECORD"]
    (dist_info / "RECORD").write_text("".join(f"{name},,\n" for name in record))
    return site / f"nvidia/cu{cuda_major}/lib"


def scripted_nvidia_smi(bin_dir: Path, compute_caps: list[str]) -> None:
    """An nvidia-smi that reports these GPUs' compute capabilities, as the real one's CSV query does."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(compute_caps) + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def path_with(monkeypatch: pytest.MonkeyPatch, *dirs: Path) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join(str(d) for d in dirs))


def flag_value(cmake_args: str, name: str) -> str | None:
    for flag in shlex.split(cmake_args):  # as scikit-build-core reads CMAKE_ARGS
        if flag.startswith(f"-D{name}="):
            return flag.split("=", 1)[1]
    return None


# --- flag selection ---------------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU flags are x86-64 Linux's")
def test_machine_without_gpu_gets_the_cpu_flags_even_with_nvcc(monkeypatch, tmp_path):
    # This machine's own case: nvcc installed, no GPU. The flags, and so the wheel's cache key, must
    # stay those of the CPU build.
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    path_with(monkeypatch, *([Path(NVCC).parent] if NVCC else []), empty)
    cmake_args, why = setup.choose_cmake_args()
    assert cmake_args == setup.x86_64_flags()
    assert cmake_args.startswith("-DGGML_NATIVE=OFF") and "CUDA" not in cmake_args
    assert "AMX" in why


@needs_nvcc
def test_nvcc_and_a_gpu_give_cuda_flags_for_the_gpus_architecture(monkeypatch, tmp_path, toolkit, isolated_cache):
    scripted_nvidia_smi(tmp_path / "bin", ["9.0"])
    path_with(monkeypatch, tmp_path / "bin", Path(NVCC).parent, Path("/usr/bin"), Path("/bin"))
    fake_cublas_package(tmp_path / "site", toolkit[1][0])
    cmake_args, why = setup.choose_cmake_args(cublas_search_path=[str(tmp_path / "site")])
    assert "-DGGML_CUDA=on" in shlex.split(cmake_args)
    assert flag_value(cmake_args, "CMAKE_CUDA_ARCHITECTURES") == "90"
    # The CPU backend in a CUDA build takes the CPU build's flags: never native (AMX crashes).
    assert cmake_args.startswith(setup.x86_64_flags() + " -DGGML_CUDA=on") or not setup.is_linux_x86_64()
    root = Path(flag_value(cmake_args, "CUDAToolkit_ROOT"))
    assert root.parent == isolated_cache / "cuda" and (root / "include" / "cublas_v2.h").is_file()
    assert flag_value(cmake_args, "CMAKE_CUDA_COMPILER") == str(root / "bin" / "nvcc")
    assert flag_value(cmake_args, "CMAKE_SHARED_LINKER_FLAGS") == f"-Wl,-rpath,{root / 'lib64'}"
    no_driver = setup.find_driver_library(toolkit[0]) is None
    assert ("-DGGML_CUDA_NO_VMM=ON" in shlex.split(cmake_args)) == no_driver
    assert "compute capability 90" in why


@needs_nvcc
def test_gpus_of_two_architectures_build_for_both(monkeypatch, tmp_path, toolkit):
    scripted_nvidia_smi(tmp_path / "bin", ["9.0", "8.0", "9.0"])
    path_with(monkeypatch, tmp_path / "bin", Path(NVCC).parent, Path("/usr/bin"), Path("/bin"))
    fake_cublas_package(tmp_path / "site", toolkit[1][0])
    cmake_args, _ = setup.choose_cmake_args(cublas_search_path=[str(tmp_path / "site")])
    assert flag_value(cmake_args, "CMAKE_CUDA_ARCHITECTURES") == "80;90"


@needs_nvcc
@pytest.mark.parametrize("cuda_arch, expected", [(None, setup.DEFAULT_CUDA_ARCH), ("86", "86")])
def test_forced_cuda_without_a_gpu_builds_for_the_default_or_given_architecture(
        monkeypatch, tmp_path, toolkit, cuda_arch, expected):
    path_with(monkeypatch, Path(NVCC).parent, Path("/usr/bin"), Path("/bin"))
    if setup.gpu_compute_capabilities():
        pytest.skip("an NVIDIA GPU is here: its architecture would be chosen")
    fake_cublas_package(tmp_path / "site", toolkit[1][0])
    cmake_args, why = setup.choose_cmake_args(force_cuda=True, cuda_arch=cuda_arch,
                                              cublas_search_path=[str(tmp_path / "site")])
    assert "-DGGML_CUDA=on" in shlex.split(cmake_args)
    assert flag_value(cmake_args, "CMAKE_CUDA_ARCHITECTURES") == expected
    assert "forced by --cuda" in why


def test_the_users_cmake_args_win_even_over_forced_cuda(monkeypatch, tmp_path):
    scripted_nvidia_smi(tmp_path / "bin", ["9.0"])
    path_with(monkeypatch, tmp_path / "bin")
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_BLAS=ON")
    assert setup.choose_cmake_args(force_cuda=True, cuda_arch="80") == ("-DGGML_BLAS=ON", "from your CMAKE_ARGS")


def test_forced_cuda_without_nvcc_is_one_line_and_exit_status_1(monkeypatch, tmp_path, capsys):
    # main() itself, with a venv stand-in so that nothing is created in the repository.
    venv_dir = tmp_path / "venv"
    (venv_dir / "bin").mkdir(parents=True)
    (venv_dir / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setattr(setup, "VENV", venv_dir)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    path_with(monkeypatch, empty)
    monkeypatch.setattr(sys, "argv", ["setup.py", "--cuda"])
    assert setup.main() == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == ["[setup] --cuda needs nvcc, the CUDA compiler, on PATH; none was found"]
    assert "Traceback" not in out.err


def test_cpu_wheel_cache_key_is_unchanged_by_the_cuda_support():
    # The CPU wheel already cached on a machine must still be found: its key is computed as before
    # CUDA support came, from the version, the flags, the Python and the platform alone.
    flags = "-DGGML_NATIVE=OFF -DGGML_AVX=ON"
    identity = "|".join([setup.LLAMA_CPP_PYTHON_VERSION, flags, sys.implementation.cache_tag, sys.platform,
                         platform.machine()])
    assert setup.build_key(flags) == hashlib.sha256(identity.encode()).hexdigest()[:16]
    assert setup.wheel_cache_root() == setup.speccli_cache_root() / "wheels"


# --- cuBLAS ---------------------------------------------------------------------------------

def test_cublas_package_is_found_by_its_record(tmp_path):
    lib = fake_cublas_package(tmp_path / "site", 13)
    found = setup.find_cublas_package([str(tmp_path / "site")], 13)
    assert found is not None and "nvidia-cublas 13.0.2.14" in found.origin
    assert {h.name for h in found.headers} == {"cublas_v2.h", "cublas_api.h"}
    assert set(found.libraries) == {lib / "libcublas.so.13", lib / "libcublasLt.so.13"}
    assert setup.find_cublas_package([str(tmp_path / "site")], 12) is None


def test_no_cublas_and_pip_cannot_fetch_it_is_one_clear_error(monkeypatch, tmp_path, isolated_cache):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(setup.SetupError, match=r"no nvidia-cublas package is installed .* pip could not fetch nvidia-cublas 13\.x"):
        setup.fetch_cublas((13, 0), Path(sys.executable), isolated_cache / "cuda")
    assert not list((isolated_cache / "cuda").glob("nvidia-cublas-*")), "a failed fetch left a directory behind"


def test_driver_library_is_found_in_the_toolkits_stubs(tmp_path):
    stubs = tmp_path / "toolkit" / "lib64" / "stubs"
    stubs.mkdir(parents=True)
    (stubs / "libcuda.so").write_text("stub")
    assert setup.find_driver_library(tmp_path / "toolkit") == stubs / "libcuda.so"


# --- the assembled toolkit root ---------------------------------------------------------------

def prepared_root(toolkit, tmp_path, cache, driver=None) -> tuple[Path, Path]:
    root_dir, (major, _) = toolkit
    lib = fake_cublas_package(tmp_path / "site", major)
    cublas = setup.find_cublas_package([str(tmp_path / "site")], major)
    return setup.prepare_toolkit_root(root_dir, cublas, driver, cache), lib


def test_toolkit_root_has_cublas_headers_and_libraries_in_all_four_places(toolkit, tmp_path, isolated_cache):
    root, lib = prepared_root(toolkit, tmp_path, isolated_cache / "cuda")
    major = toolkit[1][0]
    for include in ("include", "targets/x86_64-linux/include"):
        assert (root / include / "cublas_v2.h").resolve() == (lib.parent / "include" / "cublas_v2.h").resolve()
        assert (root / include / "cuda_runtime.h").is_file(), "the toolkit's own headers are missing"
    for lib_dir in ("lib64", "targets/x86_64-linux/lib"):
        for name in ("libcublas", "libcublasLt"):
            assert (root / lib_dir / f"{name}.so.{major}").resolve() == (lib / f"{name}.so.{major}").resolve()
            assert os.readlink(root / lib_dir / f"{name}.so") == f"{name}.so.{major}"
        assert (root / lib_dir / "libcudart.so").resolve().is_file(), "the toolkit's own libraries are missing"


def test_nvcc_in_the_toolkit_root_sees_the_root_as_its_toolkit(toolkit, tmp_path, isolated_cache):
    # nvcc derives its include and library paths from where it was called; a bin/ linked as a whole
    # would lead it back to the real toolkit, without cuBLAS.
    root, _ = prepared_root(toolkit, tmp_path, isolated_cache / "cuda")
    nvcc_root, version = setup.nvcc_toolkit(root / "bin" / "nvcc")
    assert version == toolkit[1]
    assert nvcc_root == root.resolve()


def test_driver_library_gets_an_unversioned_link(toolkit, tmp_path, isolated_cache):
    driver = tmp_path / "driver" / "libcuda.so.1"
    driver.parent.mkdir()
    driver.write_text("driver")
    root, _ = prepared_root(toolkit, tmp_path, isolated_cache / "cuda", driver=driver)
    assert (root / "lib64" / "libcuda.so").resolve() == driver


def test_rerun_reuses_the_complete_toolkit_root(toolkit, tmp_path, isolated_cache, capsys):
    first, _ = prepared_root(toolkit, tmp_path, isolated_cache / "cuda")
    marker_time = (first / setup.TOOLKIT_COMPLETE_MARKER).stat().st_mtime_ns
    capsys.readouterr()
    cublas = setup.find_cublas_package([str(tmp_path / "site")], toolkit[1][0])
    again = setup.prepare_toolkit_root(toolkit[0], cublas, None, isolated_cache / "cuda")
    assert again == first
    assert (again / setup.TOOLKIT_COMPLETE_MARKER).stat().st_mtime_ns == marker_time
    assert "assembling" not in capsys.readouterr().out
    assert [p.name for p in (isolated_cache / "cuda").iterdir() if p.name.startswith("toolkit-")] == [first.name]


def test_half_built_toolkit_roots_are_not_taken_for_complete_ones(toolkit, tmp_path, isolated_cache):
    cache = isolated_cache / "cuda"
    major = toolkit[1][0]
    fake_cublas_package(tmp_path / "site", major)
    cublas = setup.find_cublas_package([str(tmp_path / "site")], major)
    final = cache / f"toolkit-{setup.toolkit_root_key(toolkit[0], cublas, None)}"
    # An interrupted run's staging directory beside it, and a directory at the final name without the
    # completion marker (as an interrupted copy by other means would leave).
    (cache / f"{final.name}.partial-interrupted" / "include").mkdir(parents=True)
    (final / "include").mkdir(parents=True)
    (final / "include" / "half-copied.h").write_text("")
    root = setup.prepare_toolkit_root(toolkit[0], cublas, None, cache)
    assert root == final
    assert (root / setup.TOOLKIT_COMPLETE_MARKER).is_file()
    assert not (root / "include" / "half-copied.h").exists()
    assert (root / "include" / "cublas_v2.h").is_file()


# --- --llama-cpp: llama.cpp's libraries and tools built once ------------------------------------------

def test_llama_cpp_build_is_reused_when_finished_and_started_afresh_for_other_flags(tmp_path, monkeypatch):
    """The build itself is rehearsed by `bash .ci/device/check.sh --rehearse` (minutes); here, what
    decides whether it runs: pip and CMake are recorded, and pip's download leaves a real sdist."""
    version = setup.LLAMA_CPP_PYTHON_VERSION
    calls: list[list[str]] = []

    def recorded(*cmd, env=None):
        cmd = [str(c) for c in cmd]
        calls.append(cmd)
        if "download" in cmd:
            top = tmp_path / "sdist" / f"llama_cpp_python-{version}"
            (top / "vendor" / "llama.cpp").mkdir(parents=True)
            (top / "vendor" / "llama.cpp" / "CMakeLists.txt").write_text("project(llama)\n")
            with tarfile.open(Path(cmd[cmd.index("--dest") + 1]) / f"llama_cpp_python-{version}.tar.gz", "w:gz") as sdist:
                sdist.add(top, arcname=top.name)

    monkeypatch.setattr(setup, "run", recorded)
    build = tmp_path / "llama.cpp"
    assert setup.build_llama_cpp("-DGGML_AVX=ON", build, Path(sys.executable)) == build / "build" / "bin"
    assert [cmd[:2] for cmd in calls] == [[sys.executable, "-m"], ["cmake", "-S"], ["cmake", "--build"]]
    assert (build / "source" / "CMakeLists.txt").exists() and "-DGGML_AVX=ON" in calls[1]
    assert calls[2][-len(setup.TOOLS) - 1:] == ["llama", *setup.TOOLS]

    calls.clear()  # finished with these flags: nothing runs again
    assert setup.build_llama_cpp("-DGGML_AVX=ON", build, Path(sys.executable)) == build / "build" / "bin"
    assert calls == []

    (build / "build").mkdir()
    (build / "build" / "CMakeCache.txt").write_text("the other flags' cache\n")
    shutil.rmtree(tmp_path / "sdist")
    setup.build_llama_cpp("-DGGML_AVX=OFF", build, Path(sys.executable))  # other flags: afresh
    assert not (build / "build" / "CMakeCache.txt").exists()
    assert [cmd[:2] for cmd in calls] == [[sys.executable, "-m"], ["cmake", "-S"], ["cmake", "--build"]]
    assert (build / "speccli-llama-cpp.txt").read_text() == f"{version} -DGGML_AVX=OFF {setup.TOOLS_CMAKE_ARGS}\n"


def test_a_build_cut_short_goes_on_with_its_source(tmp_path, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(setup, "run", lambda *cmd, env=None: calls.append([str(c) for c in cmd]))
    build = tmp_path / "llama.cpp"
    (build / "source").mkdir(parents=True)
    (build / "source" / "CMakeLists.txt").write_text("project(llama)\n")
    # Started with these flags, and no marker: unfinished.
    (build / "identity.txt").write_text(f"{setup.LLAMA_CPP_PYTHON_VERSION} -DGGML_AVX=ON {setup.TOOLS_CMAKE_ARGS}\n")
    setup.build_llama_cpp("-DGGML_AVX=ON", build, Path(sys.executable))
    assert [cmd[:2] for cmd in calls] == [["cmake", "-S"], ["cmake", "--build"]]  # no download: the source stays
