"""A `--spec` (speccli.drafting.registry) and K (`--k`) -> the planner and K policy that implement them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from speccli.core.seam import KPolicy
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramLookup
from speccli.drafting.planner import DraftModel, Lookup, Planner
from speccli.drafting.policy import AutoK, FixedK
from speccli.drafting.registry import LOOKUPS, check_spec, require_draft_model, uses_draft_model
from speccli.drafting.suffix import SuffixLookup
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
    lookup = next((make_lookup(name, store) for name in spec.split("+") if name in LOOKUPS), None)
    return Planner(lookup, model_source(draft_model, target) if uses_draft_model(spec) else None)


def make_lookup(name: str, store: SuffixStore | None = None) -> Lookup:
    """One of registry.LOOKUPS (a name missing here is a KeyError, never another lookup)."""
    return {"ngram": NgramLookup, "suffix": lambda: SuffixLookup(store)}[name]()


def model_source(draft: Model, target: Model) -> DraftModel:
    """The draft model: its own ids where its vocabulary is the target's, else translated tokens
    (speccli/drafting/translated.py)."""
    from speccli.vocab.check import shared_tokens, vocabularies_differ  # loads tokenizers: not at import

    if vocabularies_differ(draft.path, target.path):
        return TranslatedDrafter(draft, target.tokenizer, shared_tokens(draft.path, target.path))
    return ModelDrafter(draft)
