"""Shared fixtures: tiny real GGUF models (tests/tiny_gguf.py), written once per test session; `auto`
with pretended costs for the engine tests."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

from speccli.core.stats import StepEvent
from speccli.llama.model import LoadOptions, Model
from speccli.models.config import load_registry
from speccli.models.resolve import resolve_pair
from speccli.core.seam import Draft, DraftCosts
from speccli.drafting.policy import AutoK
from tests.tiny_gguf import TinyConfig, write_related_pair, write_tiny_gguf

PRETENDED_DECODE_SECONDS = 1e-3
PRETENDED_DRAFT_TOKEN_SECONDS = 2e-4


class MemoryBoundAutoK(AutoK):
    """`auto` as on a GPU: verifying n tokens costs nearly one decode, a drafted token a fifth of one.
    On these tiny CPU models drafting rarely pays, so the real costs would mostly choose k = 0; these
    make the policy choose varied lengths from the acceptance it sees, which is what the tests need to
    exercise. Timings never move them: a busy moment on the machine must not change what a test drafts
    (a slow first draft decode once made the tiny pair's auto test draft too little)."""

    def calibrate(self, verify_seconds, draft_costs):
        super().calibrate(
            {n: PRETENDED_DECODE_SECONDS * (1 + 0.02 * n) for n in verify_seconds},
            {key: DraftCosts(PRETENDED_DRAFT_TOKEN_SECONDS, {}) for key in draft_costs},  # catch-ups free
        )
        self.verify.update = lambda *timings: None  # keep the pretended curve; acceptance still adapts

    def observe(self, draft: Draft, step: StepEvent, yielded) -> None:
        super().observe(draft, step, yielded)
        if draft.key in self.keys and self.keys[draft.key].cost.token_seconds:  # a draft model: keep its pretended cost
            self.keys[draft.key].cost.token_seconds = PRETENDED_DRAFT_TOKEN_SECONDS


@pytest.fixture(scope="module")
def gemma_pair():
    """The bundled default pair, loaded: Gemma 3 270M F32 target, its Q4_K_M draft."""
    resolved = resolve_pair(None, None, None, load_registry(), quiet=True)
    options = LoadOptions(n_ctx=512)
    with Model(resolved.target_path, options) as target, Model(resolved.draft_path, options) as draft:
        yield target, draft


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
