"""A draft source's name (`--spec`) and K (`--k`) -> the drafter and K policy that implement them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from speccli.core.seam import Drafter, KPolicy
from speccli.drafting.chain import ChainDrafter
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramDrafter
from speccli.drafting.policy import AutoK, FixedK
from speccli.validation import AUTO_K, K, check_spec, require_draft_model

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model


def make_policy(k: K) -> KPolicy:
    """'auto': K chosen per step; a number: that K every step."""
    return AutoK() if k == AUTO_K else FixedK(k)


def make_drafter(spec: str, draft_model: Model | None) -> Drafter:
    require_draft_model(check_spec(spec), draft_model)
    sources = [NgramDrafter() if name == "ngram" else ModelDrafter(draft_model) for name in spec.split("+")]
    return sources[0] if len(sources) == 1 else ChainDrafter(sources)
