"""Several draft sources in order, cheapest first: the first whose draft is expected to pay at least as
well as the next source's best would, drafts this step, and where a cheaper source has a proposal, a
costlier one is asked at all only while the steps it drafted have yielded more tokens per second than
the steps before it in the chain did.

A lookup draft costs nothing to make, but a short or shaky match may promise less than the draft model
would deliver here; the model's draft costs decodes, so it is weighed before it is made, from the K
policy's estimates (`Plan.rate`). That weighing sees one step only. Where the reply copies its input,
the tokens a model draft takes at its price are mostly ones the lookup would have copied a step later,
almost for free: on Gemma's qa task the model drafted wherever a lookup's match was short, and in three
runs the chain reached 1.5-2.0x where the lookup alone, plain steps in between, reached 2.0-2.4x. So
the chain also keeps the realized rate of each source's steps (a step counts for the source that
drafted it, a step taken over for the source whose token failed, and a plain step for the first source,
whose stretch it belongs to), and passes over a source
whose steps have done no better than those of the sources before it, where one of those has a
proposal (drafted or declined). Its rate is then not refreshed, but theirs is: when the copying stops,
their rate falls back to plain steps' and the source is asked again. Those rates are kept per prompt
(a chat turn, a bench prompt): a stretch that copied the last reply says nothing of this one, and
carried over it kept the model passed over through the next reply's prose (Gemma, the bench's tasks in
a row under one fixed cost model: 1.92 tokens per target step's cost, geometric mean, against 2.00
with rates kept per prompt).

Where no source before it has a proposal, the costlier source has no copied tokens to take: the
alternative to its draft is a plain step, and its estimates weigh the two. Passed over there as well
(with the lookup's keys told apart by how a match went on), one model draft on Gemma's `code` that
kept 1 of 5 at the start of the reply kept the model out of the rest of it, plain steps yielding more
than that one step (the bench's prompts replayed with fixed costs, tests/benchmarks/replay.py, before it
priced catch-ups: `code` 1.34 -> 1.55 tokens per target step's cost, all eight 1.94 -> 2.01; Qwen 1.42
either way).

A costlier source's draft may also be taken over: after each token it drafts, the sources before it
are asked to continue from there, and the first whose draft is expected to pay at least as well as
more of the costlier source's would ends it (`DraftRequest.take_over`; never a re-check's draft: a
re-check is a step's own choice). Where a reply starts to copy, the
lookup finds no match at the reply's own last token, but does one or two model tokens later: the draft
model's tokens lead the lookup into the text being copied, instead of drafting it at a decode per
token (Gemma, the tasks in a row under one fixed cost model, three times each way: 1.74 -> 1.97 tokens
per target step's cost, geometric mean; summarize 1.49 -> 1.94, qa 1.87 -> 2.28).

Under a fixed K (no estimates) the first source that proposes wins, and drafts all K tokens. Each rule
replayed with it removed: tests/benchmarks/RESULTS.md, "The redesigned policy".
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from speccli.core.seam import Draft, DraftCosts, DraftRequest, Drafter
from speccli.core.stats import StepEvent

REALIZED_WEIGHT = 0.1  # weight of the newest step in a source's realized rate (about the last 10 steps)


@dataclass
class RealizedRate:
    """Tokens and seconds per step, the newest step weighted REALIZED_WEIGHT: their ratio is the
    tokens per second the steps actually yielded (a ratio of means, not a mean of ratios)."""

    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        weight = REALIZED_WEIGHT if self.seconds else 1.0
        self.tokens += weight * (tokens - self.tokens)
        self.seconds += weight * (seconds - self.seconds)

    @property
    def per_second(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None


class ChainDrafter:
    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)
        self.name = "+".join(drafter.name for drafter in self.drafters)
        self._realized = self._no_steps_yet()

    def propose(self, request: DraftRequest) -> Draft:
        passed_over = None  # a cheaper source's proposal, judged all the same (see `DraftNotes.shadow`)
        policy = request.policy
        for position, (drafter, following) in enumerate(zip(self.drafters, self.drafters[1:])):
            draft = drafter.propose(self._offering_take_over(position, request))
            # The next source's best, with what it must take in first; None under a fixed K.
            catch_up, owed_prompt = following.catch_up_tokens(request.context), following.owed_prompt_tokens()
            following_rate = policy.plan(following.name, request.limit, catch_up, owed_prompt).rate
            proposal = draft if draft.tokens else draft.notes.shadow  # drafted or not; None: no match at all
            if following_rate is not None and proposal is not None and self._did_no_better(following, position):
                return draft  # even an empty one: a plain step is what this stretch has done best with
            if draft.tokens and not self._promises_more(following_rate, draft, request):
                return draft
            passed_over = passed_over or proposal
        # The last source's draft, even an empty one: its key still tells the policy what it was asked.
        last = self.drafters[-1].propose(self._offering_take_over(len(self.drafters) - 1, request))
        return replace(last, notes=replace(last.notes, shadow=passed_over))

    def _offering_take_over(self, position: int, request: DraftRequest) -> DraftRequest:
        """`request` for the source at `position`, whose draft the sources before it may take over."""
        drafting = self.drafters[position].name
        if not position or request.policy.plan(drafting, request.limit).rate is None:  # first, or a fixed K
            return request

        def take_over(drafted: Sequence[int]) -> Draft:
            extended = replace(request, context=[*request.context, *drafted], limit=request.limit - len(drafted))
            rate_of_more = request.policy.plan(drafting, extended.limit).rate  # it is drafting: caught up
            for source in self.drafters[:position]:
                draft = source.propose(extended)
                source.forget(len(request.context))  # what it took in of the drafted tokens
                if draft.tokens and not draft.notes.plan.probe and not self._promises_more(rate_of_more, draft, extended):
                    return draft
            return Draft.nothing()

        return replace(request, take_over=take_over)

    def observe(self, step: StepEvent, kept: Sequence[int]) -> None:
        counted = step.source
        if step.continuation is not None and step.drafted - step.continuation[1] <= step.accepted < step.drafted:
            # The costlier source's tokens were kept, the take-over's failed: that poor yield is not its
            # own (counted as its own, it passed the model over: RESULTS.md, "A failed take-over").
            counted = step.continuation[0]
        source = counted if counted in self._realized else self.drafters[0].name
        self._realized[source].add(step.accepted + 1, step.draft_seconds + step.target_seconds + step.other_seconds)
        for drafter in self.drafters:
            drafter.observe(step, kept)

    def _did_no_better(self, following: Drafter, position: int) -> bool:
        """Have `following`'s steps yielded no more tokens per second than the steps of the sources
        before it? Not until both have steps."""
        its = self._realized[following.name].per_second
        before = [self._realized[drafter.name].per_second for drafter in self.drafters[: position + 1]]
        known = [rate for rate in before if rate is not None]
        return its is not None and bool(known) and its <= max(known)

    @staticmethod
    def _promises_more(following_rate: float | None, draft: Draft, request: DraftRequest) -> bool:
        """Is the next source's best expected rate above that of this draft?"""
        this = request.policy.plan(draft.key, len(draft.tokens)).rate
        return this is not None and following_rate is not None and following_rate > this

    def sync(self, context: Sequence[int]) -> None:
        self._realized = self._no_steps_yet()  # a new prompt: its own stretches
        for drafter in self.drafters:
            drafter.sync(context)

    def _no_steps_yet(self) -> dict[str, RealizedRate]:
        return {drafter.name: RealizedRate() for drafter in self.drafters}

    def forget(self, n_tokens: int) -> None:
        for drafter in self.drafters:
            drafter.forget(n_tokens)

    def new_conversation(self) -> None:
        for drafter in self.drafters:
            drafter.new_conversation()

    def forget_all(self) -> None:
        for drafter in self.drafters:
            drafter.forget_all()

    def catch_up_tokens(self, context: Sequence[int]) -> int:
        return max(drafter.catch_up_tokens(context) for drafter in self.drafters)  # whichever source drafts

    def owed_prompt_tokens(self) -> int:
        return max(drafter.owed_prompt_tokens() for drafter in self.drafters)

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        return {key: cost for drafter in self.drafters for key, cost in drafter.costs(context).items()}
