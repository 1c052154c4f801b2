"""A `--spec` (speccli.drafting.registry) and K (`--k`) -> the planner and K policy that implement them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from speccli.core.seam import KPolicy
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import DraftModel, Planner
from speccli.drafting.policy import AutoK, FixedK
from speccli.drafting.registry import DraftInputs, check_spec, make_source, require_draft_model, source_named
from speccli.drafting.translated import TranslatedDrafter
from speccli.validation import AUTO_K, K

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.drafting.suffix import SuffixStore
    from speccli.llama.model import Model


def make_policy(k: K) -> KPolicy:
    """'auto': K chosen per step; a number: that K every step."""
    return AutoK() if k == AUTO_K else FixedK(k)


def make_drafter(spec: str, draft_model: Model | None, target: Model, store: SuffixStore | None = None) -> Planner:
    """The planner over the spec's sources. `store`: the earlier replies a `suffix` source drafts from,
    shared with other planners for this target (None: its own)."""
    require_draft_model(check_spec(spec), draft_model)
    inputs = DraftInputs(draft_model, target, store)
    lookups = [make_source(name, inputs) for name in spec.split("+") if not source_named(name).uses_draft_model]
    models = [make_source(name, inputs) for name in spec.split("+") if source_named(name).uses_draft_model]
    return Planner(lookups[0] if lookups else None, models[0] if models else None)


def model_source(inputs: DraftInputs) -> DraftModel:
    """The draft model: its own ids where its vocabulary is the target's, else translated tokens
    (speccli/drafting/translated.py)."""
    from speccli.vocab.check import shared_tokens, vocabularies_differ  # loads tokenizers: not at import

    draft, target = inputs.draft_model, inputs.target
    if vocabularies_differ(draft.path, target.path):
        return TranslatedDrafter(draft, target.tokenizer, shared_tokens(draft.path, target.path))
    return ModelDrafter(draft)
