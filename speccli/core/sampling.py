"""Logits -> the distribution actually sampled from, and draws from it.

The same function turns the draft's rows into q and the target's rows into p, so the verification
rule compares exactly the distributions each model samples from. (Comparing raw draft logits while
sampling from processed ones is a known bug elsewhere, and it breaks exactness.)

Order of the filters follows llama.cpp's default chain: top-k, top-p, min-p on the raw logits, then
the temperature. A filtered row is kept as its support (the few tokens that survive) and their
weights, found without sorting or partitioning the whole row; a row no filter bounds is kept dense.
"""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Callable

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

    @property
    def filtered(self) -> bool:
        return bool(self.top_k or self.top_p < 1 or self.min_p > 0)

    def validate(self) -> None:
        check_temperature(self.temperature, "temperature")
        check_top_k(self.top_k, "top-k")
        check_top_p(self.top_p, "top-p")
        check_min_p(self.min_p, "min-p")


class Distribution:
    """A distribution over a vocabulary of `size` tokens: token `ids[i]` has probability
    `weights[i] / total` and every other token 0; where `ids` is None, token i has `weights[i] / total`
    (a dense row: no filter bounded the support). `ids` ascend, so a draw by inverse CDF walks the
    tokens in id order either way, and the same uniform gives the same token from both forms."""

    __slots__ = ("ids", "weights", "size", "_total")

    def __init__(self, ids: np.ndarray | None, weights: np.ndarray, size: int, total: float | None = None) -> None:
        self.ids, self.weights, self.size, self._total = ids, weights, size, total

    @staticmethod
    def on_support(row: np.ndarray) -> Distribution:
        """A probability row (V,) as its support: the tokens of positive probability."""
        ids = np.flatnonzero(row > 0)
        return Distribution(ids, row[ids], len(row))

    @property
    def total(self) -> float:
        """The weights' sum (computed once, when first asked: a plain draw never needs it)."""
        if self._total is None:
            self._total = float(self.weights.sum(dtype=np.float64))
        return self._total

    def __getitem__(self, token: int) -> float:
        """The probability of one token."""
        if self.ids is None:
            return self.weights[token] / self.total if token < self.size else 0.0
        i = int(np.searchsorted(self.ids, token))
        return self.weights[i] / self.total if i < len(self.ids) and self.ids[i] == token else 0.0

    def at(self, tokens: np.ndarray) -> np.ndarray:
        """The probabilities of many tokens (ascending), 0 for tokens past the vocabulary."""
        if self.ids is None:
            inside = tokens < self.size
            return np.where(inside, self.weights[np.where(inside, tokens, 0)], 0) / self.total
        if not len(self.ids):
            return np.zeros(len(tokens))
        i = np.minimum(np.searchsorted(self.ids, tokens), len(self.ids) - 1)
        return np.where(self.ids[i] == tokens, self.weights[i], 0) / self.total

    def max(self) -> float:
        return float(self.weights.max() / self.total)

    def dense(self, size: int | None = None) -> np.ndarray:
        """As a probability row over `size` tokens (the vocabulary's, unless a wider one is asked for)."""
        row = np.zeros(size or self.size, dtype=self.weights.dtype)
        if self.ids is None:
            row[: self.size] = self.weights
        else:
            row[self.ids] = self.weights
        return row / self.total


def top_probability(logits: np.ndarray, out: np.ndarray) -> float:
    """The largest probability of one row of logits at temperature 1: how sure the model itself is.
    `out` (same shape, float32) is scratch space."""
    np.subtract(logits, logits.max(), out=out)
    np.exp(out, out=out)
    return float(1 / out.sum())


def distribution(logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None) -> Distribution:
    """One row of logits (V,) -> the distribution sampled from, after every filter.

    The input (often a view of llama.cpp's buffer) is never written to. `out` (float32, V), if given,
    holds a dense row's weights: the engine reuses buffers rather than fault in fresh megabytes each step.
    A dense row is left unnormalized: a draw scales its uniform by the weights' sum, which it adds up anyway.
    """
    vocab = len(logits)
    if params.greedy:
        # Temperature 0 is the limit: all mass on the most likely token (the first, on a tie).
        return Distribution(np.array([greedy_token(logits)]), np.ones(1, dtype=np.float32), vocab, 1.0)
    if params.filtered:
        return _filtered(logits, params)
    top = _checked(logits.max())
    out = np.empty(vocab, dtype=np.float32) if out is None else out
    np.subtract(logits, top, out=out)
    if params.temperature != 1:
        with np.errstate(over="ignore"):  # a tiny temperature sends the gaps to -inf: probability 0
            out *= _inverse_temperature(params)
    np.exp(out, out=out)
    return Distribution(None, out, vocab)


def probabilities(logits: np.ndarray, params: SamplingParams, out: np.ndarray | None = None) -> np.ndarray:
    """Rows of logits (R, V) -> dense rows of probabilities (R, V), float32: `distribution` row by row,
    for callers that compare whole rows (quant-check, the tests' exact distributions)."""
    logits = np.atleast_2d(logits)
    if out is None:
        out = np.empty(logits.shape, dtype=np.float32)
    for row, result in zip(logits, out):
        result[:] = distribution(row, params).dense()
    return out


def distribution_among(ids: np.ndarray | None, logits: np.ndarray, params: SamplingParams, vocab: int,
                       out: np.ndarray | None = None) -> Distribution:
    """`distribution` of a row of `vocab` tokens all at -inf but `ids` (ascending), whose logits are
    `logits`: a grammar's few allowed tokens, read without the rest of the row (cold after a decode).
    `ids` None: `logits` is the whole row (`out` as `distribution`'s)."""
    if ids is None:
        return distribution(logits, params, out)
    if params.greedy:
        return Distribution(np.array([greedy_token(logits, ids)]), np.ones(1, dtype=np.float32), vocab, 1.0)
    top = _checked(logits.max(initial=-np.inf))
    if params.filtered:
        min_logit = top + np.float32(math.log(params.min_p)) if params.min_p > 0 else -np.inf
        return _survivors(ids, logits, top, min_logit, params, vocab)
    with np.errstate(over="ignore"):
        return Distribution(ids, np.exp((logits - top) * _inverse_temperature(params)), vocab)


# Past this, scaling logit gaps changes nothing: logits as models give them differ by far more than
# 1e-30 where they differ, so every gap becomes -inf either way. The cap keeps 1/temperature finite
# (1e-39 is a valid temperature), where infinity would make the top token's 0 gap times it NaN.
_MAX_INVERSE_TEMPERATURE = 1e30
_LOWEST = np.finfo(np.float32).min  # the least finite logit


def greedy_token(logits: np.ndarray, ids: np.ndarray | None = None) -> int:
    """One row's most likely token (the first, on a tie), refused where the row is no distribution:
    argmax takes the first NaN for the largest value, so reading the value it chose is the whole check.
    `ids`, where given, name the row's entries (`distribution_among`'s)."""
    if not len(logits):  # a grammar allows nothing in a draft's narrower row
        raise NonFiniteLogitsError
    top = int(logits.argmax())
    if not math.isfinite(logits[top]):
        raise NonFiniteLogitsError
    return top if ids is None else int(ids[top])


def _inverse_temperature(params: SamplingParams) -> np.float32:
    """1/temperature, kept finite (temperatures are at most MAX_TEMPERATURE, so it is at least 1/2)."""
    return np.float32(min(1 / params.temperature, _MAX_INVERSE_TEMPERATURE))


def _checked(top: np.float32) -> np.float32:
    """A row's maximum, which says whether the row is a distribution: it is NaN where one of the logits
    is, +inf where one is, -inf where all are."""
    if not math.isfinite(top):
        raise NonFiniteLogitsError
    return top


# A row is read as a (_STRIPES, vocab // _STRIPES) matrix: column j holds tokens j, j + width, j + 2 width...
# One pass (numpy's fastest: the maximum of 64 contiguous slices) gives each column's maximum; a column
# whose maximum is below a floor holds no survivor, so only the others' 64 tokens each are candidates.
_STRIPES = 64
_ROW_STARTS = np.arange(_STRIPES)[:, None]  # stripe i starts at token i * width
# Candidates left after top-k up to this many are filtered in plain Python (`_few_survivors`).
_FEW = 256


def _filtered(row: np.ndarray, params: SamplingParams) -> Distribution:
    """One row through top-k, top-p and min-p, then the temperature.

    Only candidates are sorted: the tokens of the columns whose maximum reaches a floor that provably
    lies at or below every survivor (and the few tokens past the last whole column). Top-k's floor is
    the k-th largest column maximum: k columns hold a token at or above it, so the row's k-th largest
    is too. Min-p's is its own rule (below); it bounds the candidates where no top-p needs the rest of
    top-k's tokens for its mass.
    """
    vocab = len(row)
    width = vocab // _STRIPES
    grid, tail = row[: _STRIPES * width].reshape(_STRIPES, width), row[_STRIPES * width :]
    column_max = grid.max(axis=0) if width else tail[:0]
    top = column_max.max(initial=-np.inf)
    if len(tail):
        top = np.maximum(top, tail.max())  # NaN wins, as in the columns' maxima
    top = _checked(top)
    floor = _top_k_floor(column_max, params.top_k) if 0 < params.top_k < vocab else -np.inf
    # min-p: p >= min_p * p_top, i.e. logit >= top + ln(min_p) (llama.cpp's form of the rule).
    min_logit = top + np.float32(math.log(params.min_p)) if params.min_p > 0 else -np.inf
    if params.top_p == 1:
        floor = max(floor, min_logit)
    if floor == -np.inf and len(column_max) and column_max.min() < _LOWEST:
        floor = _LOWEST  # a grammar's mask left columns all at -inf: no token there survives a filter
    if floor > -np.inf:
        columns = np.flatnonzero(column_max >= floor)
        candidates = (_ROW_STARTS * width + columns).ravel()
        values = grid[:, columns].ravel()
        if len(tail):
            candidates = np.concatenate([candidates, np.arange(_STRIPES * width, vocab)])
            values = np.concatenate([values, tail])
    else:
        candidates, values = np.arange(vocab), row
    return _survivors(candidates, values, top, min_logit, params, vocab)


def _survivors(candidates: np.ndarray, values: np.ndarray, top: np.float32, min_logit: float, params: SamplingParams,
               vocab: int) -> Distribution:
    """The filters and the temperature on `candidates` (ascending), which hold every token that can survive
    them, with their logits `values`; `top` is the row's largest, `min_logit` min-p's bound."""
    if 0 < params.top_k < len(values):
        # The k-th largest value; ties with it are kept, so the rule does not depend on tie order. Masked
        # tokens (-inf) are left out where fewer than k are not: their probability is 0 anyway.
        kth_largest = np.partition(values, len(values) - params.top_k)[len(values) - params.top_k]
        kept = np.flatnonzero(values >= max(kth_largest, _LOWEST))
        candidates, values = candidates[kept], values[kept]
    top = float(top)
    if len(values) <= _FEW:
        return _few_survivors(candidates.tolist(), values.tolist(), top, float(min_logit), params, vocab)
    # Top-p: the most likely tokens in order (by logit, ties by id) while the mass before each is under
    # top_p of the mass of all those left; a prefix of that order, the top token always (a tiny top_p).
    if params.top_p < 1:
        untempered = np.exp(values.astype(np.float64) - top)
        total = untempered.sum()
        head = _head_holding(values, untempered, top, params.top_p * total)
        candidates, values, untempered = candidates[head], values[head], untempered[head]
        order = np.argsort(-values, kind="stable")
        mass_before = np.concatenate(([0.0], np.cumsum(untempered[order])[:-1]))
        kept = np.sort(order[: max(1, int(np.searchsorted(mass_before, params.top_p * total)))])
        candidates, values = candidates[kept], values[kept]
    if params.min_p > 0:
        kept = np.flatnonzero(values >= min_logit)
        candidates, values = candidates[kept], values[kept]
    with np.errstate(over="ignore"):
        weights = np.exp((values.astype(np.float64) - top) * _inverse_temperature(params))  # the top token's is 1
    return Distribution(candidates, weights, vocab)


def _few_survivors(ids: list[int], logits: list[float], top: float, min_logit: float, params: SamplingParams,
                   vocab: int) -> Distribution:
    """`_filtered`'s top-p, min-p and temperature on a few candidates (top-k's), in plain Python: right
    after a decode has flushed the caches, each numpy call costs more than this whole loop."""
    ranked = sorted(range(len(ids)), key=logits.__getitem__, reverse=True)  # by logit, ties by id (stable)
    untempered = [math.exp(logit - top) for logit in logits]
    limit = params.top_p * sum(untempered) if params.top_p < 1 else math.inf
    kept: list[int] = []
    mass_before = 0.0
    for i in ranked:
        if kept and (mass_before >= limit or logits[i] < min_logit):  # the top token passes both
            break
        kept.append(i)
        mass_before += untempered[i]
    kept.sort()
    inverse_temperature = float(_inverse_temperature(params))
    weights = [math.exp((logits[i] - top) * inverse_temperature) for i in kept]
    return Distribution(np.array([ids[i] for i in kept]), np.array(weights), vocab)



def _top_k_floor(column_max: np.ndarray, k: int) -> float:
    """A value at or below the row's k-th largest: the k-th largest column maximum (-inf where there
    are fewer than k columns)."""
    if len(column_max) < k:
        return -np.inf
    return np.partition(column_max, len(column_max) - k)[len(column_max) - k]


def _head_holding(values: np.ndarray, untempered: np.ndarray, top: float, mass: float) -> np.ndarray | slice:
    """Indices (ascending) of every token above some logit, chosen so that their weights (`untempered`)
    hold more than `mass`. The top-p set is a prefix of the tokens sorted by logit, so it lies within
    them: only they need sorting (a few hundred, not 262,144)."""
    for gap in (7.0, 14.0, 28.0, 56.0):
        head = np.flatnonzero(values >= top - gap)
        if untempered[head].sum() > mass * (1 + 1e-9):  # a margin for the sums' rounding
            return head
    return slice(None)


class RowBuffer:
    """A float32 (rows, vocab) array kept between steps, grown when a step needs more rows: dense rows
    are rewritten every step, and fresh arrays of a 262k vocabulary cost page faults."""

    def __init__(self) -> None:
        self._array = np.empty((0, 0), dtype=np.float32)

    def take(self, rows: int, vocab: int) -> np.ndarray:
        if self._array.shape[0] < rows or self._array.shape[1] != vocab:
            self._array = np.empty((rows, vocab), dtype=np.float32)
        return self._array[:rows]


class RowDistributions:
    """Rows of logits -> their distributions on demand, one dense row's memory at a time.

    Verification reads rows in order and stops at the first rejection: a long n-gram draft rejected
    early costs a few rows of work, not all of them. `rows[i]` stays valid until another row is asked for.
    """

    def __init__(self, logits: np.ndarray, params: SamplingParams, buffer: RowBuffer,
                 read: Callable[[int, SamplingParams, np.ndarray | None], Distribution] | None = None) -> None:
        self._logits, self._params = logits, params
        self._buffer = buffer
        self._read = read  # a row's distribution read another way (a grammar's, `ConstrainedRows`)
        self._index: int | None = None
        self._row: Distribution | None = None

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, index: int) -> Distribution:
        if index != self._index:
            out = None if self._params.filtered else self._buffer.take(1, self._logits.shape[1])[0]
            self._row = (self._read(index, self._params, out) if self._read
                         else distribution(self._logits[index], self._params, out))
            self._index = index
        return self._row


_BLOCK = 1024


def sample(dist: Distribution, rng: np.random.Generator) -> int:
    """One draw from a distribution (its weights need not sum to 1), by inverse CDF in token order.

    A dense row is drawn in two levels (block totals, then one block) instead of a cumulative sum over
    the whole vocabulary: the same draw, several times cheaper for 262k tokens.
    """
    weights = dist.weights
    if dist.ids is not None and len(weights) <= _BLOCK:  # a few survivors: plain Python beats numpy's calls
        cumulative = list(itertools.accumulate(weights.tolist()))
        index = bisect.bisect_right(cumulative, rng.random() * cumulative[-1])
        # Rounding can put the point just past the last positive weight: take that token.
        index = min(index, bisect.bisect_left(cumulative, cumulative[-1]))
        return int(dist.ids[index])
    n_blocks = -(-len(weights) // _BLOCK)
    padded = weights if len(weights) == n_blocks * _BLOCK else np.pad(weights, (0, n_blocks * _BLOCK - len(weights)))
    block_cumulative = np.cumsum(padded.reshape(n_blocks, _BLOCK).sum(axis=1, dtype=np.float64))
    target = rng.random() * block_cumulative[-1]
    block = min(int(np.searchsorted(block_cumulative, target, side="right")), n_blocks - 1)
    before = block_cumulative[block - 1] if block else 0.0
    within = np.cumsum(padded[block * _BLOCK : (block + 1) * _BLOCK], dtype=np.float64)
    index = int(np.searchsorted(within, target - before, side="right"))
    # Rounding can put the point just past this block's last positive token: take that token.
    index = block * _BLOCK + min(index, int(np.flatnonzero(within < within[-1]).size))
    return index if dist.ids is None else int(dist.ids[index])
