"""Next-token distributions compared row by row: the per-position figures of quant-check.

Per position (one row of logits each), with p from the reference and q from a candidate:

* acceptance  Σ_i min(p_i, q_i): the probability that speculative sampling accepts the candidate's
              draft token there. p and q come from `speccli.core.sampling.probabilities` with the
              sampling settings asked for, the very function the engine verifies with.
* KL, top-1   llama.cpp's `llama-perplexity --kl-divergence` figures: KL(p‖q) = Σ p (log p − log q) in
              nats on the raw distributions (softmax of the logits, temperature 1, no filters), and
              whether both raw argmaxes agree. They do not depend on the sampling settings.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speccli.core.sampling import SamplingParams, probabilities


@dataclass
class ReferenceRows:
    log_p: np.ndarray  # raw log-softmax (may hold -inf in sequential mode: dropped tail)
    p: np.ndarray  # after the sampling settings
    top: np.ndarray  # raw argmax per row


class RowComparator:
    """Rows of logits -> the per-position figures, reusing its buffers chunk after chunk."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        # At temperature 1 without filters the sampled distribution is the raw one: compute it once.
        self.raw_is_sampled = params == SamplingParams(temperature=1.0)

    def reference(self, logits: np.ndarray) -> ReferenceRows:
        return self.reference_from_log_p(log_softmax(logits))

    def reference_from_log_p(self, log_p: np.ndarray) -> ReferenceRows:
        # Log-probabilities are logits too (softmax is shift-invariant), so the settings apply alike.
        p = np.exp(log_p) if self.raw_is_sampled else probabilities(log_p, self.params)
        return ReferenceRows(log_p, p, log_p.argmax(axis=1))

    def compare(self, reference: ReferenceRows, logits: np.ndarray) -> tuple[np.ndarray, ...]:
        """(acceptance, kl, same_top, q, broken) for each row. A row with a NaN or +inf logit (`broken`:
        a file whose weights or backend went wrong) has no distribution: nothing drafted from it could
        be accepted, so its acceptance is 0 and its KL infinite."""
        broken = ~finite_rows(logits)
        if broken.any():  # computed on a stand-in (uniform) row, then overwritten
            logits = np.where(broken[:, None], np.float32(0), logits)
        log_q = log_softmax(logits)
        q = np.exp(log_q) if self.raw_is_sampled else probabilities(logits, self.params)
        # A probability: p and q each sum to 1 only to float32 rounding (the same file twice made 1.0000000004).
        acceptance = np.minimum(reference.p, q).sum(axis=1, dtype=np.float64).clip(max=1.0)
        raw_p = reference.p if self.raw_is_sampled else np.exp(reference.log_p)
        terms = log_q
        np.subtract(reference.log_p, log_q, out=terms)
        with np.errstate(invalid="ignore"):
            terms *= raw_p
        # A dropped tail (sequential mode) has p = 0 and log p = -inf: its terms are 0·(-inf), not counted.
        # The stored rows' rounding leaves an identical row at about -1e-6, where KL is 0: never below.
        kl = np.maximum(np.nansum(terms, axis=1, dtype=np.float64), 0.0)
        same_top = reference.top == logits.argmax(axis=1)
        acceptance[broken], kl[broken], same_top[broken] = 0.0, np.inf, False
        return acceptance, kl, same_top, q, broken


def finite_rows(logits: np.ndarray) -> np.ndarray:
    """Rows that are a distribution: no NaN or +inf, and a finite logit somewhere (-inf is a token
    masked out, which a model may do, but not every token)."""
    return ~(np.isnan(logits) | np.isposinf(logits)).any(axis=1) & np.isfinite(logits).any(axis=1)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    out = logits - logits.max(axis=1, keepdims=True)
    scratch = np.exp(out)
    out -= np.log(scratch.sum(axis=1, keepdims=True, dtype=np.float64)).astype(np.float32)
    return out
