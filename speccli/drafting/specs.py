"""`--spec` and `--k` as users write them -> a drafter and a K policy, checked before anything loads."""
from __future__ import annotations

from speccli.drafting.base import Drafter
from speccli.drafting.chain import ChainDrafter
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramDrafter
from speccli.drafting.policy import MAX_K, AutoK, FixedK, KPolicy
from speccli.errors import SpeccliError
from speccli.llama.model import Model

SPECS = ("model", "ngram", "ngram+model")


def check_spec(spec: str) -> str:
    if spec not in SPECS:
        raise SpeccliError(f"--spec must be one of {', '.join(SPECS)}, got {spec!r}")
    return spec


def needs_draft_model(spec: str) -> bool:
    return "model" in spec.split("+")


def parse_k(text: str | int) -> int | None:
    """'auto' -> None; an integer 1..MAX_K -> itself; anything else is refused with one line."""
    if isinstance(text, int) or text.strip().lstrip("-").isdigit():
        k = int(text)
        if not 1 <= k <= MAX_K:
            raise SpeccliError(f"--k must be 'auto' or an integer from 1 to {MAX_K}, got {k}")
        return k
    if text.strip() == "auto":
        return None
    raise SpeccliError(f"--k must be 'auto' or an integer from 1 to {MAX_K}, got {text!r}")


def make_policy(k: int | None) -> KPolicy:
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
