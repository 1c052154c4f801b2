"""From what the user named (a pair, or --target/--draft, and --spec) to loaded models, checked first.

Chat, bench and serve start here: resolve names through the registry, refuse a pair whose
vocabularies make exact speculative decoding impossible (metadata only, before any weights are
read), then load the target and, when the draft source needs one, the draft model.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from speccli.errors import SpeccliError, UsageError
from speccli.llama.model import LoadOptions, Model, check_ctx_within_training, trained_context
from speccli.models.config import load_registry
from speccli.models.resolve import ResolvedPair, resolve_pair
from speccli.llama import rpc
from speccli.drafting.registry import check_spec, uses_draft_model
from speccli.validation import CHAT_CTX, Endpoint, check_ctx, check_gpu_layers, check_threads
from speccli.vocab.check import checked_pair
from speccli.vocab.report import VocabVerdict


def fitted_context(given: int | None, default: int, paths: Iterable[Path | None], n_seq: int = 1) -> int:
    """The context to load `paths` with: --ctx as given (a model refuses it past its training context
    as it loads), or else the command's `default` lowered to the shortest training context among them,
    for each of `n_seq` sequences (serve's slots: --ctx given is split between them, as llama-server
    splits -c; by default each gets what one would). A default no one asked for must not refuse a
    model trained on less (2048-token models under chat's 4096); a context asked for that the model
    cannot honour is refused, not quietly shrunk. Every model is read here, before any loads: one
    trained with less than speccli's least context is refused."""
    trained = [trained_context(path) for path in paths if path is not None]
    if given is not None:
        return given
    return min([default, *(length for length in trained if length)]) * n_seq


@dataclass(frozen=True)
class PairRequest:
    pair: str | None = None
    target: str | None = None
    draft: str | None = None
    config: tuple[Path, ...] = ()  # --config files, in order
    n_ctx: int | None = None  # --ctx; None: default_n_ctx, fitted to the models (see `fitted_context`)
    n_threads: int | None = None
    target_n_gpu_layers: int | None = None  # None: the pair's setting from models.toml
    draft_n_gpu_layers: int | None = None
    spec: str | None = None  # the draft source; None: the pair's
    default_n_ctx: int = CHAT_CTX  # the command's
    rpc: tuple[Endpoint, ...] | None = None  # --rpc: RPC servers for the target; None: the pair's
    rpc_draft: bool = False  # the draft on them too
    tensor_split: tuple[float, ...] = ()  # --tensor-split, the target's
    n_seq: int = 1  # sequences each model's cache holds (serve's --parallel), sharing n_ctx

    def validate(self) -> None:
        """Cheap checks, before any file is read (the same ones the command line runs as it parses)."""
        # An empty name would otherwise quietly mean "not given".
        for option, given in (("--target (-m)", self.target), ("--draft (-md)", self.draft)):
            if given is not None and not given.strip():
                raise SpeccliError(f"{option} is empty; give a registry name or a GGUF path")
        if self.pair is not None and not self.pair.strip():
            raise SpeccliError("the pair name is empty; `speccli models` lists the pairs")
        if self.n_ctx is not None:
            check_ctx(self.n_ctx)
        check_threads(self.n_threads)
        check_gpu_layers(self.target_n_gpu_layers, "--ngl")
        check_gpu_layers(self.draft_n_gpu_layers, "--ngl-draft")
        if self.spec is not None:
            check_spec(self.spec)
            for option, given in (("--ngl-draft", self.draft_n_gpu_layers is not None), ("--rpc-draft", self.rpc_draft)):
                if given and not uses_draft_model(self.spec):  # options that cannot go together, as --draft there
                    raise UsageError(f"{option}: --spec {self.spec} loads no draft model; drop {option}")


@dataclass
class LoadedPair:
    resolved: ResolvedPair
    target: Model
    draft: Model | None  # None when the draft source needs no model

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
        self.target.close()

    def __enter__(self) -> LoadedPair:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def resolve(request: PairRequest, *, quiet: bool = False) -> ResolvedPair:
    registry = load_registry(*request.config)
    resolved = resolve_pair(request.pair, request.target, request.draft, registry, spec=request.spec, quiet=quiet)
    if resolved.draft_path is not None:
        report = checked_pair(resolved.draft_path, resolved.target_path)
        if report.verdict is VocabVerdict.INCOMPATIBLE and not quiet:
            how = ("it draws among the tokens both spell alike when sampling, and drafts text when greedy"
                   if report.translation["mode"] == "shared tokens" else "it drafts text, which the target re-tokenizes")
            print(f"note: draft {resolved.draft_name} does not share target {resolved.target_name}'s vocabulary "
                  f"({report.reasons[0]}): {how} (docs/drafting.md)", file=sys.stderr)
    return resolved


def open_pair(request: PairRequest, *, quiet: bool = False) -> LoadedPair:
    resolved = resolve(request, quiet=quiet)
    # One context for both: the draft model must hold every token the target does.
    n_ctx = fitted_context(request.n_ctx, request.default_n_ctx, (resolved.target_path, resolved.draft_path), request.n_seq)
    for name, path in ((resolved.target_name, resolved.target_path), (resolved.draft_name, resolved.draft_path)):
        if path is not None:  # refused by the name the user knows, where the model's own check names its file
            check_ctx_within_training(n_ctx, request.n_seq, path, name)

    servers = resolved.rpc if request.rpc is None else request.rpc
    remote = rpc.connect(servers)  # each server checked before any weights are read
    _check_placement(request, servers, len(remote) + sum(device.is_local_accelerator for device in rpc.devices()))

    def options(requested_layers: int | None, pair_layers: int, *, remote: bool,
                tensor_split: tuple[float, ...] = ()) -> LoadOptions:
        layers = pair_layers if requested_layers is None else requested_layers
        return LoadOptions(n_ctx=n_ctx, n_threads=request.n_threads, n_gpu_layers=layers, n_seq=request.n_seq,
                           rpc=servers if remote else (), tensor_split=tensor_split)

    target = Model(resolved.target_path, options(request.target_n_gpu_layers, resolved.target_n_gpu_layers,
                                                 remote=True, tensor_split=request.tensor_split), resolved.target_name)
    if resolved.draft_path is None:
        return LoadedPair(resolved, target, None)
    try:
        draft = Model(resolved.draft_path, options(request.draft_n_gpu_layers, resolved.draft_n_gpu_layers,
                                                   remote=request.rpc_draft), resolved.draft_name)
    except BaseException:
        target.close()
        raise
    return LoadedPair(resolved, target, draft)


def _check_placement(request: PairRequest, servers: tuple[Endpoint, ...], n_devices: int) -> None:
    """Placement options that would do nothing are refused (they had been ignored without a word)."""
    if request.rpc_draft and not servers:
        raise UsageError("--rpc-draft puts the draft on the RPC servers, and none are given (--rpc, or the pair's rpc)")
    if len(request.tensor_split) > n_devices:
        shares = ",".join(f"{share:g}" for share in request.tensor_split)
        where = f"{n_devices} device{'s' if n_devices != 1 else ''}" if n_devices else "no device (no --rpc server, no GPU)"
        raise UsageError(f"--tensor-split {shares}: {len(request.tensor_split)} shares, and {where} to split the "
                         "target over (the RPC servers' devices, then this machine's GPUs)")
