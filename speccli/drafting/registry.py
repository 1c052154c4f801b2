"""Every draft source by name: what `--spec` accepts, its help, and each source's kind.

A spec is one source, or a lookup then the draft model joined by "+" (cheapest first): the planner
(speccli/drafting/planner.py) drafts from at most one of each. `suffix` does the context lookup's work
as well, so the two are never chained. Light on imports: the command line checks `--spec` here before
numpy or llama.cpp load; the planner is made in speccli/drafting/specs.py.
"""
from __future__ import annotations

from speccli.errors import SpeccliError

LOOKUPS = {"ngram": "a lookup in the context", "suffix": "the lookup, and in earlier replies"}
MODELS = {"model": "the draft model"}
SPECS = (*LOOKUPS, *MODELS, *(f"{lookup}+{model}" for lookup in LOOKUPS for model in MODELS))
DEFAULT_SPEC = "suffix+model"  # a lookup where the text repeats (the context, earlier replies), the model elsewhere


def spec_help() -> str:
    sources = ", ".join(f"{name} ({summary})" for name, summary in {**LOOKUPS, **MODELS}.items())
    return f"{sources}, or a lookup then the model joined by +: {', '.join(spec for spec in SPECS if '+' in spec)}"


def uses_draft_model(spec: str) -> bool:
    return any(name in MODELS for name in spec.split("+"))


def uses_lookup(spec: str) -> bool:
    """Whether some source of `spec` drafts without the draft model (at no model step's cost)."""
    return any(name in LOOKUPS for name in spec.split("+"))


def default_spec(with_draft_model: bool) -> str:
    """DEFAULT_SPEC, less its model source where there is no draft model."""
    return DEFAULT_SPEC if with_draft_model else "+".join(name for name in DEFAULT_SPEC.split("+") if name in LOOKUPS)


def check_spec(text: str, name: str = "--spec") -> str:
    """A draft source or a chain of them (see SPECS)."""
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
