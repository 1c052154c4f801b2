"""Several draft sources in order, cheapest first: the first whose draft is expected to pay at least as
well as the next source's best would, drafts this step.

A lookup draft costs nothing to make, but a short or shaky match may promise less than the draft model
would deliver here; the model's draft costs decodes, so it is weighed before it is made, from the K
policy's estimates (`best_rate`). Under a fixed K (no estimates) the first source that proposes wins.
"""
from __future__ import annotations

from typing import Sequence

from speccli.drafting.base import Draft, DraftRequest, Drafter


class ChainDrafter:
    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)
        self.name = "+".join(drafter.name for drafter in self.drafters)

    def propose(self, request: DraftRequest) -> Draft:
        draft = Draft.nothing()
        for drafter, following in zip(self.drafters, [*self.drafters[1:], None]):
            draft = drafter.propose(request)
            if draft.tokens and (following is None or not self._next_promises_more(draft, following, request)):
                return draft
        return draft  # the last source's empty draft: its key still tells the policy what it was asked

    @staticmethod
    def _next_promises_more(draft: Draft, following: Drafter, request: DraftRequest) -> bool:
        this = request.best_rate(draft.key, len(draft.tokens))
        that = request.best_rate(following.name, request.limit)
        return this is not None and that is not None and that > this

    def sync(self, context: Sequence[int]) -> None:
        for drafter in self.drafters:
            drafter.sync(context)

    def forget(self, n_tokens: int) -> None:
        for drafter in self.drafters:
            drafter.forget(n_tokens)

    def reset(self) -> None:
        for drafter in self.drafters:
            drafter.reset()

    def token_costs(self, context: Sequence[int]) -> dict[str, float]:
        return {key: cost for drafter in self.drafters for key, cost in drafter.token_costs(context).items()}
