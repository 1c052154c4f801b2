"""A smaller model of the same vocabulary as the draft source: K decodes, each token drawn from q."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from speccli.core.sampling import Distribution, RowBuffer, distribution, greedy_token, sample, top_probability
from speccli.core.seam import Draft, DraftCosts, DraftNotes, DraftRequest, DraftSource

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model


# Catch-up sizes timed at calibration: the policy prices a catch-up of n tokens on the line through them
# (catch-ups in bench runs here, Qwen 0.5B: 41 ms for 2 tokens, 75 for 5, 126 for 10, 202 for 19, where
# a drafted token took 41 ms: within 8% of a line).
CATCH_UP_SIZES = (2, 16)


class ModelDrafter(DraftSource):
    """Drafts with a draft `Model`, keeping its KV cache a prefix of the context between steps."""

    name = "model"

    def __init__(self, model: Model) -> None:
        self.model = model
        self._q_rows = RowBuffer()
        self._prompt_end = 0  # the cache must hold the context this far before drafting (see `sync`)

    def sync(self, context: Sequence[int]) -> None:
        """Owe context[:-1] (the cache holds a prefix of it already: see `forget`): taken in at this
        model's first draft of the reply, so a reply that other sources draft throughout never pays
        for it (docs/results.md: Qwen's agent workload), and the policy weighs that one-time cost
        (`owed_prompt_tokens`). Only the part more than one batch from the end is taken in now, in the
        prefill, where a stop request is seen between batches."""
        self._prompt_end = len(context) - 1
        taken_in_now = self._prompt_end - self.model.n_batch
        if self.model.n_past < taken_in_now:
            self.model.decode(self.visible(context[self.model.n_past : taken_in_now]), n_logit_rows=0)

    def catch_up_tokens(self, context: Sequence[int]) -> int:
        """Tokens taken in as one batched decode before drafting at the end of `context`: the context
        grew without this model (lookup drafts or plain steps meanwhile) by more than the two a drafting
        step leaves behind (the pending token, and the previous bonus token if the draft never decoded
        it). All but the last: that one is decoded with the first draft token. The prompt it owes is
        counted apart (`owed_prompt_tokens`): paid once a reply, not at every draft that follows."""
        pending = len(context) - max(self.model.n_past, self._prompt_end)
        return pending - 1 if pending > 2 else 0

    def owed_prompt_tokens(self) -> int:
        """Tokens of the reply's prompt `sync` deferred that the cache does not hold yet."""
        return max(0, self._prompt_end - self.model.n_past)

    def _take_in_prompt(self, context: Sequence[int]) -> tuple[float, int]:
        """Decode the prompt `sync` deferred, if the cache does not hold it yet: (seconds, tokens)."""
        owed = self.owed_prompt_tokens()
        if not owed:
            return 0.0, 0
        began = time.perf_counter()
        self.model.decode(self.visible(context[self.model.n_past : self._prompt_end]), n_logit_rows=0)
        return time.perf_counter() - began, owed

    def propose(self, request: DraftRequest) -> Draft:
        model, policy = self.model, request.policy
        # Decoding k - 1 tokens past the context must fit in the draft's own window.
        available = min(request.limit, model.n_ctx - len(request.context) + 1)
        if available <= 0:
            return Draft.nothing()
        catch_up = self.catch_up_tokens(request.context)
        plan = policy.plan(self.name, available, catch_up, self.owed_prompt_tokens())
        if plan.k <= 0:  # not drafted: the policy still counts what it was asked
            return Draft("", self.name, [], None, notes=DraftNotes(plan))
        prompt_seconds, prompt_tokens = self._take_in_prompt(request.context)
        q_rows = self._q_rows.take(plan.k, model.n_vocab)  # dense rows' weights (no filter bounds them)
        drawn_from: list[Distribution] = []
        drafted: list[int] = []
        confidences: list[float] = []  # each drafted token's, where the policy read it
        withheld = False
        continuation = Draft.nothing()
        pending = self.visible(request.context[model.n_past :])
        catch_up_seconds = 0.0
        if catch_up:  # timed apart, so the K policy's per-token cost of this model stays what drafting costs
            began = time.perf_counter()
            model.decode(pending[:-1], n_logit_rows=0)
            catch_up_seconds = time.perf_counter() - began
            pending = pending[-1:]
        for i in range(plan.k):
            logits = model.decode(pending, n_logit_rows=1)
            if request.sampling.greedy:
                token = greedy_token(logits[0])  # refused where the row is NaN: a broken draft is named
            else:
                q = distribution(logits[0], request.sampling, out=q_rows[i])
                token = sample(q, request.rng)
                drawn_from.append(q)

            def confidence() -> float:  # computed only where the policy asks (a fixed K never does)
                greedy = request.sampling.greedy
                confidences.append(top_probability(logits[0], out=q_rows[i]) if greedy else float(q.max()))
                return confidences[-1]

            # Stopping on the draft's own confidence uses nothing the target has said: still exact.
            if not policy.keep_drafting(self.name, plan, confidence):
                withheld = True
                del confidences[len(drafted) :]  # the withheld token's: it is not part of the draft
                break
            drafted.append(token)
            pending = [token]
            if i + 1 < plan.k:
                continuation = request.take_over(drafted)
                if continuation.tokens:
                    break
        # The last draft token is decoded here only where the draft stopped short after it (its next
        # token unsure): otherwise, if all pass, the next step catches up.
        q_drawn = None if request.sampling.greedy or not drafted else drawn_from[: len(drafted)]
        return Draft(
            self.name if drafted else "", self.name, drafted, q_drawn, continuation if continuation.tokens else None,
            DraftNotes(plan, tuple(confidences), withheld, catch_up_seconds, catch_up, prompt_seconds, prompt_tokens),
        )

    def visible(self, tokens: Sequence[int]) -> list[int]:
        """Tokens as the draft can take them: a target may have ids past a smaller draft's vocabulary
        (padding that check-vocab tolerates). The draft sees token 0 there instead. That changes only
        what the draft proposes, never the output distribution: verification uses the q it sampled."""
        return [token if token < self.model.n_vocab else 0 for token in tokens]

    def forget(self, n_tokens: int) -> None:
        self.model.truncate(min(self.model.n_past, n_tokens))
        self._prompt_end = min(self._prompt_end, n_tokens)

    def new_conversation(self) -> None:
        self.model.reset()
        self._prompt_end = 0
        self._q_rows = RowBuffer()  # K rows of the vocabulary (64 MiB at K=64, 262k tokens): not kept idle

    def costs(self, context: Sequence[int]) -> dict[str, DraftCosts]:
        """One draft decode of one token, and catch-up decodes of CATCH_UP_SIZES tokens that fit, each
        timed at the cache's end and dropped again (the one-token decode twice, the second timed, so a
        first decode's set-up cost is not counted)."""
        model, start = self.model, self.model.n_past
        token = self.visible([context[-1]])  # any token costs the same: the cache may hold more than `context`
        seconds = [model.time_decode(token, n_logit_rows=1) for _ in range(2)]
        catch_up = {n: model.time_decode(token * n, n_logit_rows=0) for n in CATCH_UP_SIZES if start + n <= model.n_ctx}
        return {self.name: DraftCosts(seconds[-1], catch_up)}
