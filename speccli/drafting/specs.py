"""A `--spec` (speccli.drafting.registry) and K (`--k`) -> the planner and K policy that implement them."""
from __future__ import annotations

from pathlib import Path
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
    from speccli.vocab.report import VocabReport
    from speccli.vocab.shared import SharedVocabulary


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
    draft, target = inputs.draft_model, inputs.target
    if vocabularies_differ(draft.path, target.path):
        return TranslatedDrafter(draft, target.tokenizer, shared_tokens(draft.path, target.path))
    return ModelDrafter(draft)


def shared_tokens(draft: Path, target: Path) -> SharedVocabulary | None:
    """The shared tokens a draft of another vocabulary draws among, where they are enough (TLI_MIN_SHARE)."""
    shared = _checked(draft, target).shared
    return shared if shared.mode == "shared tokens" else None


def vocabularies_differ(draft: Path, target: Path) -> bool:
    """Whether check-vocab finds that the draft's ids cannot be proposed as the target's."""
    from speccli.vocab.report import VocabVerdict

    return _checked(draft, target).verdict is VocabVerdict.INCOMPATIBLE


def _checked(draft: Path, target: Path) -> VocabReport:
    """The pair's check-vocab report, made once as the pair was resolved. Imported here: the check loads
    tokenizers through speccli.llama, which the drafters never import themselves."""
    from speccli.vocab.check import checked_pair

    return checked_pair(draft, target)


def draft_proposes(draft: Path | None, target: Path) -> str | None:
    """What a draft model proposes to this target: "ids" (its vocabulary is the target's), "shared tokens"
    or "text" (another vocabulary, in the mode `make_drafter` picks); None without a draft model."""
    if draft is None:
        return None
    if not vocabularies_differ(draft, target):
        return "ids"
    return "text" if shared_tokens(draft, target) is None else "shared tokens"
