"""The seam between the generation loop and whatever proposes draft tokens: Draft, Drafter, KPolicy.

Each step the generator asks its `Drafter` for a `Draft` of at most `limit` tokens. The drafter asks
the K policy how many (`KPolicy.plan`, free of side effects: a source may ask as often as it likes),
naming the kind of proposal it is about to make by a key (the draft model; n-gram matches by length),
so the policy keeps acceptance and costs apart per kind. After the target's one decode the generator
tells the policy what the draft yielded and cost (`KPolicy.observe`, the policy's only update).

Nothing a drafter or the policy decides may look at the target's verdict on this step: the number
and kind of tokens depend on the past and the draft's own tokens and probabilities only. That is what
keeps the output distribution the target's (docs/exactness.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from speccli.core.sampling import Distribution, SamplingParams
from speccli.core.stats import StepEvent


@dataclass(frozen=True)
class Plan:
    """A policy's answer for one key: draft `k` tokens (0: a plain step)."""

    k: int
    # Expected tokens per second of the length the estimates choose: a chain weighs one source's
    # draft against the next's by it. None where the policy keeps no estimates (a fixed K).
    rate: float | None = None
    probe: bool = False  # a re-check of a key the estimates had ruled out: it measures, not pays


NO_PLAN = Plan(0)


@dataclass(frozen=True)
class DraftNotes:
    """What the K policy learns from a draft beside its tokens (`KPolicy.observe`): verifying the draft
    never reads them."""

    plan: Plan = NO_PLAN  # what the policy answered for the draft's key (the policy counts it as the key's ask)
    # A draft model's confidence in each token it drafted, where the policy asked for it, and whether it
    # then withheld the next token it decoded (unsure of it): the policy learns how unsure tokens fare.
    confidences: tuple[float, ...] = ()
    withheld: bool = False
    # Seconds spent taking in context the source had not seen (lookup drafts were used meanwhile), and
    # how many tokens: part of this step's drafting time, but not a cost of the tokens drafted.
    catch_up_seconds: float = 0.0
    catch_up_tokens: int = 0
    # Seconds and tokens of the prompt a draft model took in at its first draft of the reply, deferred
    # from the prefill (`ModelDrafter.sync`): the prefill's time, not this step's drafting.
    prompt_seconds: float = 0.0
    prompt_tokens: int = 0
    # A free source's proposal this step does not verify (its plan was 0, or a chain preferred another
    # source): the policy judges it against what the step yields, which is how verifying it would have
    # judged it, so a lookup's estimates follow the text at no cost.
    shadow: Draft | None = None


NO_NOTES = DraftNotes()


@dataclass(frozen=True)
class Draft:
    """One source's proposal for a step: what verifying it reads, and `notes` for the policy."""

    source: str  # "model" or "ngram", what statistics report; "" where it proposes no tokens
    key: str  # what the K policy learns from: the source, refined (e.g. "ngram:12+/same"); "" for none
    tokens: list[int]
    q: list[Distribution] | None  # what each token was drawn from; None: proposed with certainty
    # Another source's draft that took over after these tokens (`DraftRequest.take_over`): verified with
    # them in the same step, with certainty where it has no q rows; its source and key are counted apart.
    continuation: Draft | None = None
    notes: DraftNotes = NO_NOTES

    @staticmethod
    def nothing() -> Draft:
        return Draft("", "", [], None)

    @staticmethod
    def judged_only(shadow: Draft) -> Draft:
        """No tokens to verify, and `shadow` for the policy to judge (`DraftNotes.shadow`)."""
        return Draft("", "", [], None, notes=DraftNotes(shadow=shadow))

    @property
    def proposed(self) -> list[int]:
        """Every token this step verifies: these, then the continuation's."""
        return self.tokens + self.continuation.tokens if self.continuation else self.tokens


# (the tokens a draft model has drafted so far this step) -> another source's draft continuing them,
# which ends the model's own; an empty one where none takes over.
TakeOver = Callable[[Sequence[int]], Draft]


def no_take_over(drafted: Sequence[int]) -> Draft:
    return Draft.nothing()


@dataclass(frozen=True)
class DraftRequest:
    context: Sequence[int]  # every token so far; context[-1] is pending (no cache holds it yet)
    limit: int  # at most this many tokens: room in the context, tokens the reply still needs
    sampling: SamplingParams
    rng: np.random.Generator
    policy: KPolicy
    take_over: TakeOver = no_take_over  # set by a chain for its costlier sources


@dataclass(frozen=True)
class DraftCosts:
    token_seconds: float  # one drafted token
    # Seconds to take in n skipped tokens in one decode, by n (a draft model's catch-up); {} for none.
    catch_up_seconds: dict[int, float]


@dataclass(frozen=True)
class CostProfile:
    """What one loaded pair costs on this machine, measured once (`core.generator.measure_costs`) and
    read by everything that prices a step: `auto`, bench's theory, chat's estimated speedup."""

    decode_seconds: dict[int, float]  # one target decode with n logit rows, by n (1 always)
    draft_costs: dict[str, DraftCosts]  # by proposal key; {} where nothing drafted costs anything
    sample_seconds: float = 0.0  # drawing one token from one row of the target's logits

    @property
    def target_token_seconds(self) -> float:
        """What one token costs the target alone: a 1-row decode and a draw from it."""
        return self.decode_seconds[1] + self.sample_seconds


@dataclass
class ReplyDrafting:
    """The verified drafts of the reply under way: chosen on the estimates, or re-checks of a source the
    estimates had ruled out (chat says so where a reply had none of the former)."""

    chosen: int = 0
    rechecks: int = 0


class KPolicy(Protocol):
    name: str  # "4", "auto"
    needs_costs: bool  # whether `calibrate` must run before the next step
    profiled_sizes: tuple[int, ...]  # the verify sizes (logit rows) `calibrate` wants timed
    reply: ReplyDrafting | None  # None where every draft is the one asked for (a fixed K)

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        """Tokens to draft of `available` for a proposal of kind `key`, where the source must first take
        in `catch_up` skipped tokens and, once in the reply, `owed_prompt` tokens of its prompt. No side effects."""

    def keep_drafting(self, key: str, plan: Plan, confidence: Callable[[], float]) -> bool:
        """Whether a source drafting on `plan`, this sure of its next token (`confidence()`, computed
        only if needed), should still propose it. No side effects."""

    def calibrate(self, costs: CostProfile) -> None:
        """The pair's measured costs: a target decode by logit rows, and each key's drafting costs."""

    def begin_reply(self) -> None:
        """A new reply (a prompt, a chat turn) starts: its text may not be like the last one's."""

    def observe(self, draft: Draft, step: StepEvent, yielded: Sequence[int]) -> None:
        """What this step's draft (with its continuation and its notes' shadow) was planned as, yielded (`step`;
        `yielded`: the kept drafts, then the target's own token) and cost."""


class Drafter(Protocol):
    name: str  # "model", "ngram" or "ngram+model"

    def sync(self, context: Sequence[int]) -> None:
        """Take in a new prompt: hold context[:-1] (the prefix held already was kept by `forget`)."""

    def propose(self, request: DraftRequest) -> Draft: ...

    def forget(self, n_tokens: int) -> None:
        """The context was cut back to its first `n_tokens` tokens (rejected drafts, a new prompt)."""

    def observe(self, step: StepEvent, kept: Sequence[int]) -> None:
        """What the step just verified yielded and cost, whichever source drafted it, and the tokens it
        kept: the accepted drafts, then the target's own."""

    def new_conversation(self) -> None:
        """Another conversation starts: forget this one's context, keep what was learnt across them."""

    def forget_all(self) -> None:
        """Forget everything, what was learnt across conversations too."""

    def catch_up_tokens(self, context: Sequence[int]) -> int:
        """Tokens of `context` this source must take in before it can draft at its end."""

    def owed_prompt_tokens(self) -> int:
        """Tokens of this reply's prompt it must take in at its first draft (a one-time cost)."""

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        """What drafting costs, by proposal key, measured now (a draft model decodes a few times)."""


class DraftSource:
    """Defaults for a source that needs no catch-up, costs nothing to weigh, learns nothing from a step
    and keeps nothing across conversations (a lookup in the context): subclass it and write `propose`,
    `forget` and `new_conversation`."""

    def sync(self, context: Sequence[int]) -> None:
        pass

    def observe(self, step: StepEvent, kept: Sequence[int]) -> None:
        pass

    def forget_all(self) -> None:
        self.new_conversation()

    def catch_up_tokens(self, context: Sequence[int]) -> int:
        return 0

    def owed_prompt_tokens(self) -> int:
        return 0

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        return {}
