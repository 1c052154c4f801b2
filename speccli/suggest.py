"""`speccli suggest`: which draft pays for this target on this machine, predicted from what decides it.

For each candidate (a draft model of the target's vocabulary, one of another vocabulary, or the n-gram
lookup), the real drafter proposes at every position of a calibration text the target has read once
(teacher forcing: one batched decode gives the target's greedy choice at each position). Its acceptance
alpha is how often its first proposed token is that choice; its cost c is a 1-token draft decode over
the target's (a translated draft's: its drafting time per token here, reading the context as text
included); the target's verify curve V(n) is timed here. Then bench's formula,
S(K) = E(alpha, K) / (K c + V(K+1)), gives each K's speedup, and the best K ranks the candidates. A
lookup proposes only where the text repeats: its S mixes drafting steps (a share f of positions) with
plain ones. Greedy acceptance; at temperature > 0 a draft is kept less often than this.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from speccli.bench.theory import expected_tokens_per_verify
from speccli.checks.fidelity import decode_seconds
from speccli.core.sampling import SamplingParams
from speccli.drafting.policy import FixedK
from speccli.drafting.specs import make_drafter
from speccli.llama.model import LoadOptions, Model
from speccli.models.pair import fitted_context
from speccli.vocab.check import check_pair
from speccli.vocab.report import VocabVerdict

MAX_K = 8  # the longest draft predicted for
CONTEXT = 1024  # tokens each model holds (less where one was trained with less); texts are cut to fit
MIN_POSITIONS = 64  # fewer: the acceptance rests on too little text, and says so
MAX_POSITIONS = 256  # positions a candidate drafts at (the text's first ones)
NGRAM = "ngram"


@dataclass
class Candidate:
    name: str  # as the user gave it, or the registry's name; "ngram" for the lookup
    path: Path | None  # None for the lookup
    kind: str = ""  # "same vocabulary", "translated", "lookup"
    alpha: float | None = None  # first proposed token kept, where it proposed
    proposing: float = 1.0  # share of positions where it proposed (a lookup's matches)
    c: float | None = None  # drafting seconds per proposed token / the target's 1-token decode
    best_k: int = 0
    predicted: float | None = None  # at best_k; None where it was not measured
    positions: int = 0
    skipped: str | None = None  # why it was not measured (one line)
    measured: float | None = None  # --confirm's bench speedup


@dataclass
class Suggestion:
    target: str
    text: str  # what the acceptance was measured on
    verify: dict[int, float]  # V(n): an n-token decode / a 1-token decode, on this machine
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def ranked(self) -> list[Candidate]:
        measured = [c for c in self.candidates if c.predicted is not None]
        # --confirm's measured speedup outranks a prediction; of equal figures, the one keeping more drafts
        # (a candidate keeping none had been named the best where nothing paid).
        return (sorted(measured, key=lambda c: (-(c.predicted if c.measured is None else c.measured), -(c.alpha or 0)))
                + [c for c in self.candidates if c.predicted is None])

    def verdict(self) -> str:
        best = next(iter(self.ranked), None)
        if best is None or best.predicted is None:
            return "no candidate could be measured"
        if best.measured is not None and best.measured > 1.0:
            return (f"best here: {best.name} at K={best.best_k or 'auto'}, measured {best.measured:.2f}x the target "
                    f"alone (predicted {best.predicted:.2f}x)")
        if best.measured is None and best.predicted > 1.0 and best.best_k:
            return f"best here: {best.name} at K={best.best_k}, predicted {best.predicted:.2f}x the target alone"
        return (f"nothing pays here: verifying 4 tokens costs {self.verify[4]:.1f} target steps on this machine, "
                f"and the best candidate, {best.name}, "
                + (f"keeps {best.alpha:.2f} of its first tokens" if best.alpha is not None else "proposed nothing here")
                + (f" at c = {best.c:.2f} per token" if best.c else "")
                + (f", measured {best.measured:.2f}x" if best.measured is not None else "") + "; the target alone is as fast")

    def to_dict(self) -> dict:
        return {"target": self.target, "text": self.text, "verify": {str(n): v for n, v in self.verify.items()},
                "candidates": [asdict(c) | {"path": str(c.path) if c.path else None}
                               | ({"kind": c.kind or None, "proposing": None} if c.skipped is not None else {})
                               for c in self.ranked],
                "verdict": self.verdict()}


def classify(candidate: Candidate, target_path: Path) -> None:
    """Same vocabulary, translated, or skipped (larger than the target; no token's text in common)."""
    if candidate.path is None:
        candidate.kind = "lookup"
        return
    size, target_size = candidate.path.stat().st_size, target_path.stat().st_size
    if size >= target_size:
        candidate.skipped = (f"its file is no smaller than the target's ({size / 2**20:.0f} MiB against "
                             f"{target_size / 2**20:.0f} MiB): as a draft it cannot pay")
        return
    report = check_pair(candidate.path, target_path)
    if report.verdict is not VocabVerdict.INCOMPATIBLE:
        candidate.kind = "same vocabulary"
    elif report.shared.share == 0:
        candidate.skipped = "its vocabulary has no token's text in common with the target's"
    else:
        candidate.kind = "translated"


def target_choices(target: Model, sequences: Sequence[list[int]]) -> list[np.ndarray]:
    """The target's greedy next token after each prefix of each sequence (teacher forcing)."""
    choices = []
    for tokens in sequences:
        target.reset()
        rows = []
        for start in range(0, len(tokens), target.n_batch):
            chunk = tokens[start:start + target.n_batch]
            rows.append(np.argmax(target.decode(chunk, n_logit_rows=len(chunk)), axis=1))
        choices.append(np.concatenate(rows))
    target.reset()
    return choices


def measure_candidate(candidate: Candidate, target: Model, draft: Model | None, sequences: Sequence[list[int]],
                      choices: Sequence[np.ndarray], target_token_seconds: float, advance: Callable[[], None]) -> None:
    """Acceptance, proposing share and c of one candidate, by its real drafter at each position."""
    drafter = make_drafter("ngram" if draft is None else "model", draft, target)
    # A draft of the target's ids is asked for one token; translated text needs a few (a word cut short
    # is not proposed), a lookup proposes what its match gives.
    k = 1 if candidate.kind == "same vocabulary" else 4 if candidate.kind == "translated" else MAX_K
    policy, sampling, rng = FixedK(k), SamplingParams(temperature=0), np.random.default_rng(0)
    kept = proposed = positions = proposed_tokens = 0
    seconds = 0.0
    for tokens, chosen in zip(sequences, choices):
        drafter.new_conversation()
        for end in range(1, min(len(tokens), MAX_POSITIONS)):
            context = tokens[:end + 1]  # its last token is pending, as in a step
            began = time.perf_counter()
            drafter.sync(context)
            draft_tokens = drafter.draft(context, k, sampling, rng, policy).tokens
            seconds += time.perf_counter() - began
            drafter.forget(len(context) - 1)
            positions += 1
            if draft_tokens:
                proposed += 1
                proposed_tokens += len(draft_tokens)
                kept += draft_tokens[0] == chosen[end]
            advance()
    candidate.positions = positions
    candidate.proposing = proposed / positions if positions else 0.0
    candidate.alpha = kept / proposed if proposed else None
    if draft is None:
        candidate.c = 0.0
    elif candidate.kind == "same vocabulary":  # a 1-token draft decode, as bench profiles it
        candidate.c = decode_seconds(draft, sequences[0][:64], [1])[1] / target_token_seconds
    else:  # what drafting cost here, reading the context as text each time included
        candidate.c = seconds / max(proposed_tokens, 1) / target_token_seconds


def predict(candidate: Candidate, verify: dict[int, float]) -> None:
    """The best K and its speedup by the formula (a lookup: drafting only where it proposes)."""
    f, alpha, c = candidate.proposing, candidate.alpha or 0.0, candidate.c or 0.0
    speedups = {k: (f * expected_tokens_per_verify(alpha, k) + (1 - f)) / (f * (k * c + verify[k + 1]) + (1 - f))
                for k in range(1, MAX_K + 1)}
    best = max(speedups, key=speedups.get)
    candidate.best_k, candidate.predicted = (best, speedups[best]) if speedups[best] > 1.0 else (0, 1.0)


def suggest(target_name: str, target_path: Path, candidates: list[Candidate], sequences_of: Callable[[Model], list[list[int]]],
            text: str, n_threads: int | None, progress: Callable[[str, int, int], None]) -> Suggestion:
    """Measure every candidate not skipped against the target; `progress(what, done, total)`."""
    for candidate in candidates:
        if candidate.skipped is None:
            try:
                classify(candidate, target_path)
            except Exception as error:  # a file that is not GGUF, unreadable: named, the others go on
                candidate.skipped = _why(error, candidate)
    n_ctx = fitted_context(None, CONTEXT, [target_path])
    options = LoadOptions(n_ctx=n_ctx, n_threads=n_threads)
    with Model(target_path, options) as target:
        sequences = sequences_of(target)
        choices = target_choices(target, sequences)
        context = sequences[0][: min(len(sequences[0]), 64)]
        timed = decode_seconds(target, context, range(1, MAX_K + 2))
        # A wider verify is never cheaper than a narrower one; timed apart, noise had shown V(3) 0.55.
        verify = {n: max(timed[m] for m in timed if m <= n) / timed[1] for n in timed}
        result = Suggestion(target_name, text, verify, candidates)
        per_candidate = sum(min(len(s), MAX_POSITIONS) - 1 for s in sequences)
        todo = [c for c in candidates if c.skipped is None]
        for number, candidate in enumerate(todo):
            done = [0]

            def advance() -> None:
                done[0] += 1
                progress(candidate.name, number * per_candidate + done[0], len(todo) * per_candidate)

            try:
                if candidate.path is None:
                    measure_candidate(candidate, target, None, sequences, choices, timed[1], advance)
                else:
                    draft_options = LoadOptions(n_ctx=fitted_context(None, n_ctx, [candidate.path]), n_threads=n_threads)
                    with Model(candidate.path, draft_options) as draft:
                        measure_candidate(candidate, target, draft, sequences, choices, timed[1], advance)
            except Exception as error:
                candidate.skipped = _why(error, candidate)
                continue
            predict(candidate, verify)
    return result


def too_few_positions(result: Suggestion) -> str | None:
    positions = max((c.positions for c in result.candidates), default=0)
    if positions and positions < MIN_POSITIONS:
        return (f"the acceptance rests on {positions} positions of text, fewer than {MIN_POSITIONS}: "
                "give a longer --text for figures to trust")
    return None


def _why(error: Exception, candidate: Candidate) -> str:
    """The error's words, less the candidate's path they may begin with: the listing names it already."""
    return str(error).removeprefix(f"{candidate.path}: ")
