"""The seam between the generator and whatever proposes draft tokens.

A `Drafter` is told the context (every token so far; the last one is still pending: no cache holds
it yet), proposes up to some number of tokens, and is told when the context is cut back. How many it
proposes is asked of the K policy through `DraftRequest.length_for`, with a key naming what kind of
proposal it is about to make (a draft model, a long or short n-gram match), so the policy can keep
acceptance and costs apart per kind; a draft model also asks it, token by token, whether to go on
when it grows unsure (`keep_drafting`), and asks whoever made the request (a chain) whether a cheaper
source takes its draft over from there (`take_over`: a lookup that finds the text being copied once the
model's tokens are appended). Nothing here may look at the target's verdict on this step: the number
and kind of tokens depend on the past and the draft's own tokens and probabilities only, which is what
keeps the output exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from speccli.core.sampling import SamplingParams
from speccli.core.stats import StepEvent

# (proposal key, tokens available, tokens the source must take in before it drafts) -> tokens to draft.
# The last is a draft model's catch-up on context it skipped (steps another source drafted); 0 for a lookup.
LengthFor = Callable[[str, int, int], int]
# (proposal key, tokens available, tokens to take in first) -> best expected tokens/s
RateOf = Callable[[str, int, int], "float | None"]
# (proposal key, the source's own confidence in its next token) -> draft it? The confidence is a function,
# computed only if asked: a fixed K never asks, and a greedy draft would otherwise pay a pass over its row.
KeepDrafting = Callable[[str, Callable[[], float]], bool]
# (the tokens a draft model has drafted so far this step) -> another source's draft continuing them, which
# ends the model's own; an empty one where none takes over.
TakeOver = Callable[[Sequence[int]], "Draft"]


def no_take_over(drafted: Sequence[int]) -> Draft:
    return Draft.nothing()


@dataclass(frozen=True)
class DraftRequest:
    context: Sequence[int]  # every token so far; context[-1] is pending
    limit: int  # at most this many tokens: room in the context, tokens the reply still needs
    sampling: SamplingParams
    rng: np.random.Generator
    length_for: LengthFor
    best_rate: RateOf  # side-effect free: lets a chain weigh one source's draft against the next's
    keep_drafting: KeepDrafting  # a draft model may stop short of the length asked when it grows unsure
    # `length_for` without counting an ask: a take-over's question is asked after each drafted token,
    # and counted it had brought a lookup key's re-check due within a step or two (see AutoK).
    length_if_asked: LengthFor
    take_over: TakeOver = no_take_over


@dataclass(frozen=True)
class Draft:
    source: str  # "model" or "ngram": what statistics report
    key: str  # what the K policy learns from: the source, refined (e.g. "ngram:long")
    tokens: list[int]
    q: np.ndarray | None  # (len(tokens), V): the rows the tokens were drawn from; None: proposed with certainty
    # Seconds spent taking in context the source had not seen (lookup drafts were used meanwhile), and
    # how many tokens: part of this step's drafting time, but not a cost of the tokens drafted.
    catch_up_seconds: float = 0.0
    catch_up_tokens: int = 0
    # Another source's draft that took over after these tokens (see `TakeOver`): verified with them in
    # the same step, with certainty where it has no q rows; its source and key are counted apart.
    continuation: Draft | None = None
    # A free source's proposal this step did not verify (the policy chose no tokens of it, or a chain
    # preferred another source): the K policy judges it against what the step yielded instead, which is
    # how verifying it would have judged it. So a lookup's estimates follow the text at no cost.
    shadow: Draft | None = None

    @staticmethod
    def nothing() -> Draft:
        return Draft("", "", [], None)

    @property
    def proposed(self) -> list[int]:
        """Every token this step verifies: these, then the continuation's."""
        return self.tokens + self.continuation.tokens if self.continuation else self.tokens


@dataclass(frozen=True)
class DraftCosts:
    token_seconds: float  # one drafted token
    # Seconds to take in n skipped tokens in one decode, by n (a draft model's catch-up); {} for none.
    catch_up_seconds: dict[int, float]


class Drafter(Protocol):
    name: str  # "model", "ngram" or "ngram+model"

    def sync(self, context: Sequence[int]) -> None:
        """Take in a new prompt: hold context[:-1] (the prefix held already was kept by `forget`)."""

    def propose(self, request: DraftRequest) -> Draft: ...

    def forget(self, n_tokens: int) -> None:
        """The context was cut back to its first `n_tokens` tokens (rejected drafts, a new prompt)."""

    def observe(self, step: StepEvent) -> None:
        """What the step just verified yielded and cost, whichever source drafted it (a chain weighs its
        sources by it; the sources themselves learn nothing from it: the K policy does)."""

    def reset(self) -> None: ...

    def catch_up_tokens(self, context: Sequence[int]) -> int:
        """Tokens of `context` this source must take in before it can draft at its end: what it skipped
        while other sources drafted (0 for a lookup, whose index takes a token in microseconds)."""

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        """What drafting costs, by proposal key, measured now (a draft model decodes a few times)."""
