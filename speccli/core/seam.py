"""The seam between the generation loop and the drafting that feeds it: Draft, Drafting, KPolicy.

Each step the generator asks its `Drafting` (speccli/drafting/planner.py) for a `Draft` of at most
`limit` tokens, and after the target's one decode tells it what the step yielded (`observe`). The
planner asks the K policy how many tokens each kind of proposal should draft (`KPolicy.plan`, free of
side effects), naming the kind by a key (the draft model; lookup matches by length and history), and
the policy learns only in `KPolicy.observe`.

Nothing the planner or the policy decides may look at the target's verdict on this step: the number
and kind of tokens depend on the past and the draft's own tokens and probabilities only. That is what
keeps the output distribution the target's (docs/exactness.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from speccli.core.constraint import Constraint
from speccli.core.sampling import Distribution, SamplingParams
from speccli.core.stats import StepEvent


@dataclass(frozen=True)
class Plan:
    """A policy's answer for one key: draft `k` tokens (0: a plain step)."""

    k: int
    # Expected tokens per second of the length the estimates choose: the planner weighs one source's
    # draft against another's by it. None where the policy keeps no estimates (a fixed K).
    rate: float | None = None
    probe: bool = False  # a re-check of a key the estimates had ruled out: it measures, not pays


NO_PLAN = Plan(0)


@dataclass(frozen=True)
class Segment:
    """One source's part of a step: what it proposed under which plan. A step verifies at most two
    segments in a row (a draft model's tokens, then a lookup taking over); a proposal the step does
    not verify is judged against what the step yields (`Draft.judged`)."""

    source: str  # "model", "ngram" (a match in the context) or "suffix" (a match in earlier replies)
    key: str  # what the K policy learns from: the source, refined (e.g. "ngram:12+/same")
    tokens: list[int]
    plan: Plan = NO_PLAN


@dataclass(frozen=True)
class Draft:
    """A step's proposal: what verifying it reads (`tokens`, `q`) and, for the policy, who proposed what."""

    segments: tuple[Segment, ...] = ()  # the first asked to draft (its tokens may be none), then a take-over
    # What the first len(q) tokens were drawn from (None rows: the grammar's); the rest are certain.
    q: list[Distribution | None] | None = None
    forced: tuple[int, ...] = ()  # tokens the grammar forces, verified before the segments' (certain)
    judged: Segment | None = None  # a free proposal not verified: judged against what the step yields
    # Seconds and tokens a draft model took in before drafting: context it had skipped (a catch-up, part
    # of the step's drafting but not a cost of its tokens), and the reply's prompt at its first draft
    # (the prefill's time, deferred: `ModelDrafter.sync`).
    catch_up_seconds: float = 0.0
    catch_up_tokens: int = 0
    prompt_seconds: float = 0.0
    prompt_tokens: int = 0

    @property
    def tokens(self) -> list[int]:
        """Every token this step verifies: the forced ones, then segment after segment."""
        return [*self.forced, *(token for segment in self.segments for token in segment.tokens)]

    @property
    def source(self) -> str:
        """The source of the first token a segment verifies; "" where none does."""
        return self.segments[0].source if self.segments and self.segments[0].tokens else ""

    @property
    def continuation(self) -> Segment | None:
        """The segment that took over from the first, if any."""
        return self.segments[1] if len(self.segments) > 1 else None


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

    def calibrate(self, costs: CostProfile) -> None:
        """The pair's measured costs: a target decode by logit rows, and each key's drafting costs."""

    def begin_reply(self) -> None:
        """A new reply (a prompt, a chat turn) starts: its text may not be like the last one's."""

    def observe(self, draft: Draft, step: StepEvent, yielded: Sequence[int]) -> None:
        """What this step's draft was planned as, yielded (`step`; `yielded`: the kept drafts, then the
        target's own token) and cost."""


class Drafting(Protocol):
    """What the generator drives (speccli.drafting.planner.Planner): one call per step, one to learn."""

    name: str  # the --spec it drafts by: "model", "ngram", "suffix+model", ...

    def sync(self, context: Sequence[int]) -> None:
        """Take in a new prompt: hold context[:-1] (the prefix held already was kept by `forget`)."""

    def draft(self, context: Sequence[int], limit: int, sampling: SamplingParams, rng: np.random.Generator,
              policy: KPolicy, constraint: Constraint | None = None) -> Draft:
        """At most `limit` tokens to verify after `context` (whose last token no cache holds yet), each
        one the grammar allows where the reply has one (`constraint`, left where it was found)."""

    def observe(self, draft: Draft, step: StepEvent, kept: Sequence[int], policy: KPolicy) -> None:
        """What the step yielded and cost, and the tokens it kept: the accepted drafts, then the target's."""

    def forget(self, n_tokens: int) -> None:
        """The context was cut back to its first `n_tokens` tokens (rejected drafts, a new prompt)."""

    def new_conversation(self) -> None:
        """Another conversation starts: forget this one's context, keep what was learnt across them."""

    def forget_all(self) -> None:
        """Forget everything, what was learnt across conversations too."""

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        """What drafting costs, by proposal key, measured now (a draft model decodes a few times)."""
