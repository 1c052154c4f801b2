"""A draft source's name (`--spec`) and K (`--k`) -> the drafter and K policy that implement them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from speccli.drafting.base import Drafter
from speccli.drafting.chain import ChainDrafter
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramDrafter
from speccli.drafting.policy import AutoK, FixedK, KPolicy
from speccli.errors import SpeccliError
from speccli.settings import check_spec

if TYPE_CHECKING:  # annotations only: llama_cpp is speccli.llama's alone to import
    from speccli.llama.model import Model


def make_policy(k: int | None) -> KPolicy:
    """None ('auto'): K chosen per step; an integer: that K every step."""
    return AutoK() if k is None else FixedK(k)


def make_drafter(spec: str, draft_model: Model | None) -> Drafter:
    sources = []
    for name in check_spec(spec).split("+"):
        if name == "ngram":
            sources.append(NgramDrafter())
        else:
            if draft_model is None:
                raise SpeccliError(f"--spec {spec} needs a draft model")
            sources.append(ModelDrafter(draft_model))
    return sources[0] if len(sources) == 1 else ChainDrafter(sources)
