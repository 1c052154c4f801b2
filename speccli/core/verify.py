"""Accept or reject the draft's K tokens against the target's K+1 rows.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023). With q_i the draft's distribution
and p_i the target's at draft position i, and x_i ~ q_i the drafted token:

    accept x_i with probability  min(1, p_i(x_i) / q_i(x_i))
    at the first rejection i:    emit y ~ norm(max(0, p_i - q_i))  and stop
    if all K are accepted:       emit a bonus y ~ p_K

Each emitted token is then distributed exactly as p_i: the accepted part contributes
min(q(x), p(x)), the residual sum(max(0, p - q)) * norm(max(0, p - q))(x) = max(0, p(x) - q(x)),
and the two add up to p(x). Greedy decoding is the limit of one-hot p and q: accept while the
draft's token is the target's argmax, then emit the target's argmax.

A deterministic draft (n-gram lookup) has no q: it proposes x with certainty, i.e. q = one-hot(x).
The same rule then reads

    accept x_i with probability  p_i(x_i)
    at the first rejection i:    emit y ~ p_i with x_i removed, renormalised  (= norm(max(0, p_i - q_i)))

and each emitted token is again distributed as p_i: P(x) = p(x) from acceptance, and for y != x,
(1 - p(x)) * p(y) / (1 - p(x)) = p(y). How many tokens are drafted may depend on anything known
before verification (the context, the draft's own samples, past acceptance): it decides only at
which positions the rule runs, never what it emits there. So may where each token comes from: a
draft model's first tokens, then a lookup continuing them (each position's q is what proposed its
token, given the tokens before it), is verified position by position by the same rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from speccli.core.sampling import Distribution, greedy_token, sample


@dataclass(frozen=True)
class DraftVerdict:
    """What verifying one draft decided: how many drafted tokens the target kept, and its token after them."""

    n_accepted: int  # how many of the K drafted tokens were kept
    next_token: int  # the target's own token after them: a correction, or the bonus if all K passed

    def is_bonus(self, k: int) -> bool:
        return self.n_accepted == k


def acceptance_probabilities(p_of_drafted: np.ndarray, q_of_drafted: np.ndarray) -> np.ndarray:
    """min(1, p(x)/q(x)) for each drafted x. q(x) > 0 because x was drawn from q."""
    return np.minimum(1.0, p_of_drafted / q_of_drafted)


def residual_distribution(p: Distribution, q: Distribution) -> Distribution:
    """norm(max(0, p - q)): what to draw from after a rejection. It is positive only where p is, so it
    lives on p's support, with q read there (q's own support may be another vocabulary's size). Its
    mass is positive whenever a rejection is possible, since rejecting needs some x with q(x) > p(x),
    hence some y with p(y) > q(y). Rounding can still leave none (p and q equal but for float32 noise):
    then p itself is the answer."""
    if p.ids is None:
        residual = p.weights / p.total
        if q.ids is None:
            shared = min(p.size, q.size)
            residual[:shared] -= q.weights[:shared] / q.total
        else:
            inside = q.ids < p.size
            residual[q.ids[inside]] -= q.weights[inside] / q.total
    else:
        residual = p.weights / p.total - q.at(p.ids)
    np.maximum(residual, 0, out=residual)
    mass = float(residual.sum(dtype=np.float64))
    return Distribution(p.ids, residual, p.size, mass) if mass > 0 else p


def verify_sampled(
    drafted: Sequence[int], q: Sequence[Distribution | None] | None, p: Sequence[Distribution], rng: np.random.Generator
) -> DraftVerdict:
    """drafted: K ids; q: the draft distributions the first len(q) of them were drawn from (K rows
    for a draft model's draft; None for a lookup's; a None row for a token the grammar forced), the
    rest proposed with certainty; p: K+1 target distributions (p[i] is row i; rows after the first
    rejection are never read, so they need not be computed)."""
    k, drawn = len(drafted), 0 if q is None else len(q)
    uniforms = rng.random(k)
    for i, token in enumerate(drafted):
        if i < drawn and q[i] is not None:
            if not uniforms[i] < acceptance_probabilities(p[i][token], q[i][token]):
                return DraftVerdict(i, sample(residual_distribution(p[i], q[i]), rng))
        elif not uniforms[i] < p[i][token]:
            return DraftVerdict(i, sample(without_token(p[i], token), rng))
    return DraftVerdict(k, sample(p[k], rng))


def without_token(p: Distribution, token: int) -> Distribution:
    """norm(max(0, p - one-hot(token))): p with `token` removed. A rejection of `token` needs
    p(token) < 1, so some other token has mass; rounding aside, where none is left, p is returned."""
    residual = p.weights.copy()
    if p.ids is None:
        if token < p.size:
            residual[token] = 0
    else:
        residual[p.ids == token] = 0
    mass = float(residual.sum(dtype=np.float64))
    return Distribution(p.ids, residual, p.size, mass) if mass > 0 else p


def verify_greedy(drafted: Sequence[int], target_logits: np.ndarray,
                  argmax: Callable[[int], int] | None = None) -> DraftVerdict:
    """Keep drafts while they equal the target's argmax; then emit the target's argmax. Rows after the
    first mismatch are never read. `argmax(i)`, where given, is row i's (a grammar's, over what it allows)."""
    argmax = argmax or (lambda i: greedy_token(target_logits[i]))
    for i in range(len(target_logits)):
        choice = argmax(i)
        if i == len(drafted) or drafted[i] != choice:
            return DraftVerdict(i, choice)
    raise ValueError(f"{len(drafted)} drafts need {len(drafted) + 1} rows of logits, got {len(target_logits)}")
