"""Shared fixtures: tiny real GGUF models (tests/tiny_gguf.py), written once per test session."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.tiny_gguf import TinyConfig, write_related_pair, write_tiny_gguf


class TinyPair(NamedTuple):
    target: Path
    draft: Path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> Path:
    """One tiny llama model: vocab 512, width 64, 2 layers (~0.4 MB, writes and loads in milliseconds)."""
    return write_tiny_gguf(tiny_dir / "tiny.gguf", TinyConfig())


@pytest.fixture(scope="session")
def tiny_pair(tiny_dir: Path) -> TinyPair:
    """A related pair: an 8-layer target and a 2-layer draft equal to its first 2 layers, eps 0.05
    (greedy agreement ~0.89, see write_related_pair)."""
    target, draft = write_related_pair(tiny_dir / "pair", target_layers=8, draft_layers=2, eps=0.05)
    return TinyPair(target, draft)


@contextmanager
def loaded_related_pair(directory: Path, *, target_layers: int, draft_layers: int, eps: float):
    """A related pair written to `directory` and loaded: (target, draft) Models, one thread each,
    llama.cpp's smallest context (256)."""
    from speccli.llama.model import LoadOptions, Model

    target_path, draft_path = write_related_pair(directory, target_layers=target_layers, draft_layers=draft_layers, eps=eps)
    options = LoadOptions(n_ctx=256, n_threads=1)
    with Model(target_path, options) as target, Model(draft_path, options) as draft:
        yield target, draft
