"""Logits -> the distribution actually sampled from, for many rows at once.

The same function turns the draft's rows into q and the target's rows into p, so the verification
rule compares exactly the distributions each model samples from. (Comparing raw draft logits while
sampling from processed ones is a known bug elsewhere, and it breaks exactness.)

Order of the filters follows llama.cpp's default chain: top-k, top-p, min-p on the raw logits, then
the temperature.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speccli.errors import NonFiniteLogitsError
from speccli.validation import check_min_p, check_temperature, check_top_k, check_top_p


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8  # 0 means greedy: always the most likely token
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # keep the smallest set of most likely tokens with total probability >= top_p
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def validate(self) -> None:
        check_temperature(self.temperature, "temperature")
        check_top_k(self.top_k, "top-k")
        check_top_p(self.top_p, "top-p")
        check_min_p(self.min_p, "min-p")


def top_probability(logits: np.ndarray, out: np.ndarray) -> float:
    """The largest probability of one row of logits at temperature 1: how sure the model itself is.
    `out` (same shape, float32) is scratch space."""
    np.subtract(logits, logits.max(), out=out)
    np.exp(out, out=out)
    return float(1 / out.sum())


def probabilities(logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None) -> np.ndarray:
    """Rows of logits (R, V) -> rows of probabilities (R, V), float32, after every filter.

    The input (often a view of llama.cpp's buffer) is never written to. `out`, if given, receives
    the result: the engine reuses one buffer rather than fault in fresh megabytes 2K+1 times a step.
    The common case (no filters) is a few passes over the row: shift, scale, exp, normalize.
    """
    logits = np.atleast_2d(logits)
    if out is None:
        out = np.empty(logits.shape, dtype=np.float32)
    if params.greedy:
        # Temperature 0 is the limit: all mass on the most likely token (the first, on a tie).
        out.fill(0)
        out[np.arange(len(logits)), greedy_choice(logits)] = 1
        return out
    if params.top_k or params.top_p < 1 or params.min_p > 0:
        for row, result in zip(logits, out):
            result[:] = _filtered_probabilities(row, params)
        return out
    # The maxima, needed anyway, say whether each row is a distribution: a row's is NaN where one of its
    # logits is, +inf where one is, -inf where all are.
    maxima = logits.max(axis=1, keepdims=True)
    if not np.isfinite(maxima).all():
        raise NonFiniteLogitsError
    np.subtract(logits, maxima, out=out)
    with np.errstate(over="ignore"):  # a tiny temperature sends the gaps to -inf: probability 0
        out *= _inverse_temperature(params)
    np.exp(out, out=out)
    out /= out.sum(axis=1, keepdims=True)
    return out


# Past this, scaling logit gaps changes nothing: float32 logits that differ at all differ by far more
# than 1e-30, so every gap becomes -inf either way. The cap keeps 1/temperature finite (1e-39 is a
# valid temperature), where infinity would make the top token's 0 gap times it NaN.
_MAX_INVERSE_TEMPERATURE = 1e30


def greedy_choice(logits: np.ndarray) -> np.ndarray:
    """Each row's most likely token (the first, on a tie), refused where the row is no distribution:
    argmax takes the first NaN for the largest value, so reading the values it chose is the whole check."""
    top = logits.argmax(axis=1)
    if not np.isfinite(logits[np.arange(len(logits)), top]).all():
        raise NonFiniteLogitsError
    return top


def _inverse_temperature(params: SamplingParams) -> np.float32:
    return np.float32(min(1 / params.temperature, _MAX_INVERSE_TEMPERATURE))


def _filtered_probabilities(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """One row through top-k, top-p and min-p, then the temperature.

    Works on the surviving candidates only: after top-k 40, sorting for top-p costs 40 values,
    not 262,144.
    """
    vocab = len(row)
    if 0 < params.top_k < vocab:
        # The k-th largest value; ties with it are kept, so the rule does not depend on tie order.
        kth_largest = np.partition(row, vocab - params.top_k)[vocab - params.top_k]
        candidates = np.flatnonzero(row >= kth_largest)
    else:
        candidates = np.arange(vocab)
    values = row[candidates].astype(np.float32)
    # A NaN compares false with everything: NaN logits leave no candidate, or a NaN or infinite top one.
    top = values.max() if len(values) else np.nan
    if not np.isfinite(top):
        raise NonFiniteLogitsError
    if params.top_p < 1 or params.min_p > 0:
        untempered = _softmax(values, top)
        keep = np.ones(len(values), dtype=bool)
        if params.min_p > 0:
            keep &= untempered >= params.min_p * untempered.max()
        if params.top_p < 1:
            head = _head_holding(untempered, params.top_p)
            order = head[np.argsort(-untempered[head], kind="stable")]
            mass_before = np.cumsum(untempered[order]) - untempered[order]
            in_top_p = np.zeros(len(values), dtype=bool)
            in_top_p[order[mass_before < params.top_p]] = True
            in_top_p[order[0]] = True  # the top token always: a top_p below float32's least (1e-46) is 0 there
            keep &= in_top_p
        candidates, values = candidates[keep], values[keep]
    probs = np.zeros(vocab, dtype=np.float32)
    with np.errstate(over="ignore"):
        probs[candidates] = _softmax((values - top) * _inverse_temperature(params), 0)  # the top token is kept
    return probs


def _head_holding(probs: np.ndarray, mass: float) -> np.ndarray:
    """Indices (ascending) of every token above some probability threshold, the threshold chosen
    so that they hold more than `mass`. The top-p set is a prefix of the tokens sorted by
    probability, so it lies within them: only they need sorting (a few hundred, not 262,144).
    The margin keeps float32 rounding in the sorted cumulative sum from stopping short."""
    threshold = probs.max()
    while threshold > 1e-30:
        threshold *= 1e-3
        head = np.flatnonzero(probs >= threshold)
        if probs[head].sum() >= mass + 1e-3:
            return head
    return np.flatnonzero(probs > 0)


def _softmax(values: np.ndarray, top: float) -> np.ndarray:
    """softmax(values), given their largest."""
    exp = np.exp(values - top)
    return exp / exp.sum()


class RowBuffer:
    """A float32 (rows, vocab) array kept between steps, grown when a step needs more rows: rows of
    probabilities are rewritten every step, and fresh arrays of a 262k vocabulary cost page faults."""

    def __init__(self) -> None:
        self._array = np.empty((0, 0), dtype=np.float32)

    def take(self, rows: int, vocab: int) -> np.ndarray:
        if self._array.shape[0] < rows or self._array.shape[1] != vocab:
            self._array = np.empty((rows, vocab), dtype=np.float32)
        return self._array[:rows]


class RowProbabilities:
    """Rows of logits -> probability rows on demand, one row's memory at a time.

    Verification reads rows in order and stops at the first rejection: a long n-gram draft rejected
    early costs a few rows of work, not all of them, and no (K+1, vocab) array is ever held (1 MB a
    row at Gemma's 262k tokens). `rows[i]` stays valid until another row is asked for.
    """

    def __init__(self, logits: np.ndarray, params: SamplingParams, buffer: RowBuffer) -> None:
        self._logits, self._params = logits, params
        self._row = buffer.take(1, logits.shape[1])
        self._index: int | None = None

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, index: int) -> np.ndarray:
        if index != self._index:
            probabilities(self._logits[index : index + 1], self._params, out=self._row)
            self._index = index
        return self._row[0]


_BLOCK = 1024


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector (need not sum exactly to 1), by inverse CDF.

    Two levels (block totals, then one block) instead of a cumulative sum over the whole
    vocabulary: the same draw, several times cheaper for 262k tokens.
    """
    n_blocks = -(-len(probs) // _BLOCK)
    padded = probs if len(probs) == n_blocks * _BLOCK else np.pad(probs, (0, n_blocks * _BLOCK - len(probs)))
    block_cumulative = np.cumsum(padded.reshape(n_blocks, _BLOCK).sum(axis=1, dtype=np.float64))
    target = rng.random() * block_cumulative[-1]
    block = min(int(np.searchsorted(block_cumulative, target, side="right")), n_blocks - 1)
    before = block_cumulative[block - 1] if block else 0.0
    within = np.cumsum(padded[block * _BLOCK : (block + 1) * _BLOCK], dtype=np.float64)
    index = int(np.searchsorted(within, target - before, side="right"))
    # Rounding can put the point just past this block's last positive token: take that token.
    index = min(index, int(np.flatnonzero(within < within[-1]).size))
    return block * _BLOCK + index
