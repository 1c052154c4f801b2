"""The planner: it owns each step's drafting, from asking the sources to learning from the verdict.

The order it asks them in (the grammar's forced tokens, the lookup, which source drafts, the draft
model token by token with its stop and the lookup's take-over, then `observe`) is docs/drafting.md's
*One step, as the planner runs it*; the numbers in `_draft` follow it. Sources never see the policy: a
lookup returns a `Match`, a draft model its next token and q (or, of another vocabulary, a block of tokens).
Under a fixed K (`Plan.rate` None) the first source that proposes drafts all K tokens.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Protocol, Sequence

import numpy as np

from speccli.core.constraint import Constraint
from speccli.core.sampling import Distribution, SamplingParams
from speccli.core.seam import Draft, DraftCosts, KPolicy, Segment
from speccli.core.stats import StepEvent
from speccli.drafting.model import Intake
from speccli.drafting.ngram import JUDGED_TOKENS, Match


class Lookup(Protocol):
    """A source that drafts at no model step's cost: the context's lookup, or the suffix store's."""

    name: str

    def match(self, context: Sequence[int], limit: int) -> Match | None: ...
    def kept(self, tokens: Sequence[int]) -> None: ...
    def sync(self, context: Sequence[int]) -> None: ...
    def forget(self, n_tokens: int) -> None: ...
    def new_conversation(self) -> None: ...
    def forget_all(self) -> None: ...


class DraftModel(Protocol):
    """A draft model: `ModelDrafter` (a token at a time) or `TranslatedDrafter` (a block at a time)."""

    name: str
    drafts_by_token: bool

    def room(self, context: Sequence[int], limit: int) -> int: ...
    def catch_up_tokens(self, context: Sequence[int]) -> int: ...
    def owed_prompt_tokens(self) -> int: ...
    def begin(self, context: Sequence[int], k: int) -> Intake: ...
    def next(self, sampling: SamplingParams, rng: np.random.Generator,
             constraint: Constraint | None = None) -> tuple[int, Distribution | None]: ...
    def take(self, *tokens: int) -> None: ...
    def draft_block(self, context: Sequence[int], k: int, limit: int, sampling: SamplingParams,
                    rng: np.random.Generator) -> tuple[list[int], list[Distribution] | None, Intake]: ...
    def sync(self, context: Sequence[int]) -> None: ...
    def forget(self, n_tokens: int) -> None: ...
    def new_conversation(self) -> None: ...
    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]: ...


class Planner:
    """Drafts each step from a lookup, a draft model, or a lookup then a draft model (cheapest first)."""

    def __init__(self, lookup: Lookup | None = None, model: DraftModel | None = None) -> None:
        if lookup is None and model is None:
            raise ValueError("a planner needs a source")
        self.lookup, self.model = lookup, model
        self.name = "+".join(source.name for source in (lookup, model) if source is not None)
        self._constraint: Constraint | None = None  # the grammar's state during a step's drafting, if any

    # --- a step -------------------------------------------------------------------------------------

    def draft(self, context: Sequence[int], limit: int, sampling: SamplingParams, rng: np.random.Generator,
              policy: KPolicy, constraint: Constraint | None = None) -> Draft:
        """0. Under a grammar, the tokens it forces come first, then the sources' (each one it allows; the
        state advanced along the draft, and left where it was found)."""
        if constraint is None:
            return self._draft(context, limit, sampling, rng, policy, None)
        forced = constraint.forced(limit)
        constraint.push(forced)
        try:
            draft = self._draft([*context, *forced], limit - len(forced), sampling, rng, policy, constraint)
        finally:
            constraint.pop(constraint.depth)
            if forced and self.lookup is not None:
                self.lookup.forget(len(context))
        if not forced:
            return draft
        q = None if draft.q is None else [None] * len(forced) + draft.q
        return replace(draft, forced=tuple(forced), q=q)

    def _draft(self, context: Sequence[int], limit: int, sampling: SamplingParams, rng: np.random.Generator,
               policy: KPolicy, constraint: Constraint | None) -> Draft:
        if limit <= 0:
            return Draft()
        self._constraint = constraint
        if self.lookup is None:
            return self._model_draft(context, limit, sampling, rng, policy)
        # 1. The lookup's match, planned for its kind.
        drafted, judged = self._offer(self._match(context, limit), policy)
        if self.model is None:
            return Draft((drafted,)) if drafted else Draft(judged=judged)
        # 2. Which source drafts: the lookup's draft stands unless the model promises better.
        model_rate = policy.plan(self.model.name, limit, self.model.catch_up_tokens(context),
                                 self.model.owed_prompt_tokens()).rate
        if drafted and not _promises_more(model_rate, drafted, policy):
            return Draft((drafted,))
        # 3. The draft model drafts; the lookup's proposal, passed over, is judged all the same.
        return replace(self._model_draft(context, limit, sampling, rng, policy), judged=drafted or judged)

    def _match(self, context: Sequence[int], limit: int) -> Match | None:
        """The lookup's match, cut at the first token the grammar forbids."""
        match = self.lookup.match(context, limit)
        if match is None or self._constraint is None:
            return match
        legal = self._constraint.legal_prefix(match.following)
        return replace(match, following=match.following[:legal]) if legal else None

    def _offer(self, match: Match | None, policy: KPolicy) -> tuple[Segment | None, Segment | None]:
        """A lookup's match as (a segment to verify, None), or (None, the match to judge) where the policy
        plans none."""
        if match is None:
            return None, None
        plan = policy.plan(match.key, len(match.following))
        if plan.k <= 0:
            return None, Segment(match.source, match.key, match.following[:JUDGED_TOKENS], plan)
        return Segment(match.source, match.key, match.following[: plan.k], plan), None

    def _model_draft(self, context: Sequence[int], limit: int, sampling: SamplingParams, rng: np.random.Generator,
                     policy: KPolicy) -> Draft:
        model = self.model
        available = model.room(context, limit)
        if available <= 0:
            return Draft()
        catch_up = model.catch_up_tokens(context)
        plan = policy.plan(model.name, available, catch_up, model.owed_prompt_tokens())
        if plan.k <= 0:  # not drafted: the policy still counts what it was asked
            return Draft((Segment(model.name, model.name, [], plan),))
        constraint = self._constraint
        if not model.drafts_by_token:
            tokens, q, intake = model.draft_block(context, plan.k, limit, sampling, rng)
            if constraint is not None:  # another vocabulary's rows cannot be masked: cut at the first illegal token
                tokens = tokens[: constraint.legal_prefix(tokens)]
                q = q[: len(tokens)] if q else q
            return _with_intake(Draft((Segment(model.name, model.name, tokens, plan),), q), intake)
        # A take-over is weighed on the estimates: under a fixed K there are none.
        may_take_over = self.lookup is not None and policy.plan(model.name, limit).rate is not None
        intake = model.begin(context, plan.k)
        tokens: list[int] = []
        q: list[Distribution | None] = []
        continuation = None
        while len(tokens) < plan.k:
            if constraint is not None and (forced := constraint.forced(plan.k - len(tokens))):
                # Forced tokens are certain: drafted without the model's steps, verified as certain.
                tokens += forced
                q += [None] * len(forced)
                model.take(*forced)
                constraint.push(forced)
                if constraint.stopped:
                    break
                continue
            token, drawn_from = model.next(sampling, rng, constraint)
            tokens.append(token)
            q.append(drawn_from)
            model.take(token)
            if constraint is not None:
                constraint.push([token])
                if constraint.stopped:  # complete, or ended: nothing but an end of generation may follow
                    break
            if len(tokens) < plan.k and may_take_over:
                continuation = self._take_over(context, tokens, limit, policy)
                if continuation is not None:
                    break
        own = Segment(model.name, model.name, tokens, plan)
        segments = (own,) if continuation is None else (own, continuation)
        drawn = any(row is not None for row in q)  # greedy drafts, or the grammar's alone: all certain
        return _with_intake(Draft(segments, q if drawn and tokens else None), intake)

    def _take_over(self, context: Sequence[int], drafted: Sequence[int], limit: int, policy: KPolicy) -> Segment | None:
        """The lookup's draft from the model's tokens on, where it is expected to pay at least as well as
        more of the model's would (its index cut back after the look)."""
        rest = limit - len(drafted)
        rate_of_more = policy.plan(self.model.name, rest).rate  # it is drafting: caught up
        match = self._match([*context, *drafted], rest)
        self.lookup.forget(len(context))
        segment, _ = self._offer(match, policy)
        if segment is not None and not segment.plan.probe and not _promises_more(rate_of_more, segment, policy):
            return segment
        return None

    # --- learning ---------------------------------------------------------------------------------

    def observe(self, draft: Draft, step: StepEvent, kept: Sequence[int], policy: KPolicy) -> None:
        """The one place a step is learnt from: the policy's estimates and the lookup's store. The grammar's
        forced tokens are no source's: the sources are judged only past them (if all were kept); their
        rows stay in `forced`, as verifying them cost."""
        yielded = kept
        if step.forced:
            forced = step.forced
            if step.accepted >= forced:  # the sources' tokens were judged: a step that began after the forced ones
                draft, yielded = replace(draft, forced=()), kept[forced:]
                step = replace(step, drafted=step.drafted - forced, accepted=step.accepted - forced)
            else:  # a forced token was rejected (another tokenization was drawn): no source's token was judged
                draft, step = Draft(), replace(step, drafted=0, accepted=0, source=None, continuation=None)
        policy.observe(draft, step, yielded)
        if self.lookup is not None:
            self.lookup.kept(kept)

    # --- the sources' caches ------------------------------------------------------------------------

    def _sources(self) -> list[Lookup | DraftModel]:
        return [source for source in (self.lookup, self.model) if source is not None]

    def sync(self, context: Sequence[int]) -> None:
        for source in self._sources():
            source.sync(context)

    def forget(self, n_tokens: int) -> None:
        for source in self._sources():
            source.forget(n_tokens)

    def new_conversation(self) -> None:
        for source in self._sources():
            source.new_conversation()

    def forget_all(self) -> None:
        if self.lookup is not None:
            self.lookup.forget_all()  # the suffix store too
        if self.model is not None:
            self.model.new_conversation()  # a draft model keeps nothing across conversations

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        return self.model.costs(context) if self.model is not None else {}


def _promises_more(model_rate: float | None, segment: Segment, policy: KPolicy) -> bool:
    """Is the model's best expected rate above that of this lookup draft?"""
    this = policy.plan(segment.key, len(segment.tokens)).rate
    return this is not None and model_rate is not None and model_rate > this


def _with_intake(draft: Draft, intake: Intake) -> Draft:
    return replace(draft, **vars(intake))
