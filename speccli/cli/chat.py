"""`speccli chat`: options -> a pair request and sampling settings -> `speccli.chat.command.run_chat`."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from speccli.cli.options import (
    GrammarOption, JsonSchemaOption, KOption, MaxTokensOption, MinPOption, RememberOption, SpecOption, TemperatureOption,
    TopKOption, TopPOption, checked, grammar_spec, with_pair_options,
)
from speccli.validation import CHAT_CTX, check_seed

if TYPE_CHECKING:
    from speccli.models.pair import PairRequest


@with_pair_options(default_n_ctx=CHAT_CTX)
def chat(
    pair_request: PairRequest,
    spec: SpecOption = None,
    k: KOption = None,
    temperature: TemperatureOption = 0.8,
    top_k: TopKOption = 40,
    top_p: TopPOption = 0.95,
    min_p: MinPOption = 0.05,
    seed: Annotated[
        Optional[int],
        typer.Option("--seed", "-s", help="Random seed; -1 or none: random. A reply repeats under a fixed --k with drafts from the prompt alone (docs/chat.md, Seeds).", callback=checked(check_seed)),
    ] = None,
    max_tokens: MaxTokensOption = 512,
    system: Annotated[Optional[str], typer.Option("--system", help="System prompt.")] = None,
    prompt: Annotated[
        Optional[str],
        typer.Option(
            "--prompt", "-p",
            help="Reply to this one message and exit; '-' reads it from stdin. Without it, piped stdin is "
            "read one turn per line (slash commands work).",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object per reply on stdout: text, finish reason, statistics; a {\"session\": ...} object at the end and for /stats.")
    ] = False,
    color_provenance: Annotated[
        bool,
        typer.Option(
            "--color-provenance/--no-color-provenance",
            help="Color tokens by origin: accepted draft, target correction, bonus.",
        ),
    ] = True,
    remember: RememberOption = None,
    json_schema: JsonSchemaOption = None,
    grammar: GrammarOption = None,
) -> None:
    """Chat with a pair: streamed replies colored by token origin, with live speculative-decoding statistics."""
    from speccli.chat.command import run_chat
    from speccli.core.sampling import SamplingParams

    run_chat(
        replace(pair_request, spec=spec),
        sampling=SamplingParams(temperature, top_k, top_p, min_p),
        k=k,
        seed=seed,
        max_tokens=max_tokens,
        system=system,
        prompt=prompt,
        json_output=json_output,
        provenance=color_provenance,
        remember=remember,
        grammar=grammar_spec(json_schema, grammar),
    )
