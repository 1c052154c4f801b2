"""`speccli quant-check`: resolve the models, refuse candidates with another vocabulary, tokenize the
text, measure with a progress bar, and build the report (`fidelity` measures, `report` words it)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from speccli.checks.corpus import TextSource, tokenize_source
from speccli.checks.fidelity import TokenSequence, measure, memory_is_short
from speccli.checks.report import QuantCheckReport, build_report
from speccli.core.sampling import SamplingParams
from speccli.errors import SpeccliError, UsageError
from speccli.llama.model import LoadOptions
from speccli.llama.rpc import connect, exiting, on_server_lost
from speccli.llama.tokenizer import load_vocab_only
from speccli.models.config import load_registry
from speccli.models.pair import fitted_context
from speccli.models.resolve import resolve_models
from speccli.util.progress import progress_bar
from speccli.validation import BENCH_CTX, Endpoint
from speccli.vocab.check import check_pair
from speccli.vocab.report import VocabVerdict


def run_quant_check(
    reference: str, candidates: list[str], source: TextSource, params: SamplingParams, *,
    sequential: bool, n_ctx: int | None, threads: int | None, config: tuple[Path, ...], rpc: tuple[Endpoint, ...] = (),
) -> QuantCheckReport:
    """Each candidate (a registry name or GGUF path) measured against `reference` over `source`; every
    model's layers on the `rpc` servers where any are named."""
    params.validate()
    registry = load_registry(*config)
    reference_path, *candidate_paths = resolve_models([reference, *candidates], registry)
    _require_distinct_files(candidates, candidate_paths)
    for name, path in zip(candidates, candidate_paths):
        _require_same_vocabulary((name, path), (reference, reference_path))
    n_ctx = fitted_context(n_ctx, BENCH_CTX, [reference_path, *candidate_paths])
    connect(rpc)  # each server checked before any weights are read
    on_server_lost(exiting(2))  # 1 is a verdict here (BROKEN)
    with load_vocab_only(reference_path) as tokenizer:
        sequences = [TokenSequence(name, tokens) for name, tokens in tokenize_source(source, tokenizer, n_ctx)]
        sequential = sequential or memory_is_short(reference_path, candidate_paths)
        total = sum(len(s.tokens) for s in sequences) * (len(candidate_paths) + sequential)
        with progress_bar(Console(stderr=True)) as bar:
            task = bar.add_task("loading", total=total)
            measurement = measure(
                reference_path, candidate_paths, sequences, params, LoadOptions(n_ctx=n_ctx, n_threads=threads, rpc=rpc),
                sequential=sequential, progress=lambda what, done: bar.update(task, advance=done, description=what),
            )
        return build_report(measurement, candidates, tokenizer, params, source.description, n_ctx)


def _require_distinct_files(names: list[str], paths: list[Path]) -> None:
    """Each candidate measured once: the same file twice (again, or by a link) would print one model's
    noise as if two models differed. (The reference as a candidate stays: it checks the measurement.)"""
    seen: dict[Path, str] = {}
    for name, path in zip(names, paths):
        if path.resolve() in seen:
            raise UsageError(f"candidate {name} is the same file as candidate {seen[path.resolve()]}; give each once")
        seen[path.resolve()] = name


def _require_same_vocabulary(candidate: tuple[str, Path], reference: tuple[str, Path]) -> None:
    """A quant of the reference has its vocabulary, token for token: its rows are compared position by
    position, so even a draft-compatible vocabulary of another size is refused. Each is (name as given,
    file); check-vocab's reasons call the candidate the draft and the reference the target."""
    vocab = check_pair(candidate[1], reference[1])
    if vocab.verdict is VocabVerdict.INCOMPATIBLE or vocab.draft.size != vocab.target.size:
        why = vocab.reasons[0] if vocab.reasons else f"{vocab.draft.size} tokens against {vocab.target.size}"
        raise SpeccliError(f"candidate {candidate[0]} does not share the vocabulary of reference {reference[0]} "
                           f"(check-vocab, the candidate as draft: {why})")
