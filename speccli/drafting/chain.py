"""Several draft sources in order: the first that proposes something drafts this step."""
from __future__ import annotations

from typing import Sequence

from speccli.drafting.base import Draft, DraftRequest, Drafter


class ChainDrafter:
    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)
        self.name = "+".join(drafter.name for drafter in self.drafters)

    def propose(self, request: DraftRequest) -> Draft:
        for drafter in self.drafters:
            draft = drafter.propose(request)
            if draft.tokens:
                return draft
        return Draft.nothing()

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
