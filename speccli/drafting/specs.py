"""A draft source's name (`--spec`) and K (`--k`) -> the drafter and K policy that implement them."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from speccli.core.seam import Drafter, DraftSource, KPolicy
from speccli.drafting.chain import ChainDrafter
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramDrafter
from speccli.drafting.policy import AutoK, FixedK
from speccli.drafting.translated import TranslatedDrafter
from speccli.validation import AUTO_K, K, check_spec, require_draft_model

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model
    from speccli.vocab.report import VocabReport
    from speccli.vocab.shared import SharedVocabulary


def make_policy(k: K) -> KPolicy:
    """'auto': K chosen per step; a number: that K every step."""
    return AutoK() if k == AUTO_K else FixedK(k)


def make_drafter(spec: str, draft_model: Model | None, target: Model | None = None) -> Drafter:
    """`target`: where given, a draft model whose vocabulary is not the target's drafts translated tokens
    (speccli/drafting/translated.py); without it, a draft model proposes its own ids."""
    require_draft_model(check_spec(spec), draft_model)

    def model_source() -> DraftSource:
        if target is not None and draft_model is not None and vocabularies_differ(draft_model.path, target.path):
            return TranslatedDrafter(draft_model, target.tokenizer, shared_tokens(draft_model.path, target.path))
        return ModelDrafter(draft_model)

    sources = [NgramDrafter() if name == "ngram" else model_source() for name in spec.split("+")]
    return sources[0] if len(sources) == 1 else ChainDrafter(sources)


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
