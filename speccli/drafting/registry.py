"""Every draft source by name: what `--spec` accepts, its help, and how each is made.

A new source is one file in this folder (a lookup or a draft model, as the planner asks them:
speccli/drafting/planner.py, with a `from_inputs` constructor) and one line in SOURCES, which declares
its kind. The `--spec` values follow from SOURCES: each source alone, or a lookup then the draft model
joined by "+" (cheapest first). Light on imports: the command line checks `--spec` here before numpy or
llama.cpp load; each source's module is imported only when a planner is made.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING

from speccli.errors import SpeccliError

if TYPE_CHECKING:
    from speccli.drafting.planner import DraftModel, Lookup
    from speccli.drafting.suffix import SuffixStore
    from speccli.llama.model import Model


@dataclass(frozen=True)
class RegisteredSource:
    name: str  # as `--spec` and the statistics name it
    uses_draft_model: bool  # its kind: a draft model (at most one in a spec, and last), else a lookup
    summary: str  # a few words for --help
    make: str  # "module:callable", the callable taking `DraftInputs`
    includes: tuple[str, ...] = ()  # sources it does the work of: never chained with it


SOURCES = (
    RegisteredSource("ngram", False, "a lookup in the context", "speccli.drafting.ngram:NgramLookup.from_inputs"),
    RegisteredSource("suffix", False, "the lookup, and in earlier replies", "speccli.drafting.suffix:SuffixLookup.from_inputs", ("ngram",)),
    RegisteredSource("model", True, "the draft model", "speccli.drafting.specs:model_source"),
)
DEFAULT_SPEC = "suffix+model"  # a lookup where the text repeats (the context, earlier replies), the model elsewhere


@dataclass(frozen=True)
class DraftInputs:
    """What a source may be made from: the loaded models, and the store of earlier replies it shares
    with other drafters of this target (None: its own, for this drafter's life)."""

    draft_model: Model | None
    target: Model
    store: SuffixStore | None = None


def source_named(name: str) -> RegisteredSource:
    return next(source for source in SOURCES if source.name == name)


def _chains() -> tuple[str, ...]:
    lookups = [source.name for source in SOURCES if not source.uses_draft_model]
    models = [source.name for source in SOURCES if source.uses_draft_model]
    chains = []
    for size in range(1, len(lookups) + 1):
        chains += ["+".join(names) for names in combinations(lookups, size) if not _overlap(names)]
    return (*chains, *models, *(f"{chain}+{model}" for chain in chains for model in models))


def _overlap(names: tuple[str, ...]) -> bool:
    return any(other in source_named(name).includes for name in names for other in names)


SPECS = _chains()  # every --spec value: each source alone, then chains


def spec_help() -> str:
    sources = ", ".join(f"{source.name} ({source.summary})" for source in SOURCES)
    return f"{sources}, or a lookup then the model joined by +: {', '.join(spec for spec in SPECS if '+' in spec)}"


def uses_draft_model(spec: str) -> bool:
    return any(source_named(name).uses_draft_model for name in spec.split("+"))


def uses_lookup(spec: str) -> bool:
    """Whether some source of `spec` drafts without the draft model (at no model step's cost)."""
    return not all(source_named(name).uses_draft_model for name in spec.split("+"))


def default_spec(with_draft_model: bool) -> str:
    """DEFAULT_SPEC, less its model source where there is no draft model."""
    return DEFAULT_SPEC if with_draft_model else "+".join(n for n in DEFAULT_SPEC.split("+") if not source_named(n).uses_draft_model)


def make_source(name: str, inputs: DraftInputs) -> Lookup | DraftModel:
    from functools import reduce
    from importlib import import_module

    module, attributes = source_named(name).make.split(":")
    return reduce(getattr, attributes.split("."), import_module(module))(inputs)


def check_spec(text: str, name: str = "--spec") -> str:
    """A draft source or a chain of them (speccli.drafting.registry)."""
    if text not in SPECS:
        raise SpeccliError(f"{name} must be one of {', '.join(SPECS)}, got {text!r}")
    return text


def require_draft_model(spec: str, draft: object | None) -> None:
    """A guard behind the command line's own check (`resolve_pair` refuses such a pair before loading)."""
    if draft is None and uses_draft_model(spec):
        raise SpeccliError(f"--spec {spec} needs a draft model, and none was loaded")


def parse_spec_list(text: str, name: str = "--spec") -> list[str]:
    """'ngram' -> ['ngram']; 'model,ngram' -> both, in the order given, each once."""
    specs = [check_spec(item.strip(), name) for item in text.split(",")]
    return list(dict.fromkeys(specs))
