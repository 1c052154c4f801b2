"""`speccli chat`: options -> a pair request and sampling settings -> `speccli.chat.command.run_chat`."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from speccli.cli.options import (
    RpcDraftOption, RpcOption, TensorSplitOption,
    ConfigOption, ContextOption, RememberOption, DraftGpuLayersOption, DraftOption, KOption, MaxTokensOption, MinPOption, PairArgument,
    SpecOption, TargetGpuLayersOption, TargetOption, TemperatureOption, ThreadsOption, TopKOption, TopPOption, checked,
)
from speccli.validation import CHAT_CTX, check_seed


def chat(
    pair: PairArgument = None,
    target: TargetOption = None,
    draft: DraftOption = None,
    spec: SpecOption = None,
    k: KOption = None,
    temperature: TemperatureOption = 0.8,
    top_k: TopKOption = 40,
    top_p: TopPOption = 0.95,
    min_p: MinPOption = 0.05,
    seed: Annotated[
        Optional[int],
        typer.Option("--seed", "-s", help="Random seed; -1 or none: random.", callback=checked(check_seed)),
    ] = None,
    max_tokens: MaxTokensOption = 512,
    ctx: ContextOption = None,
    threads: ThreadsOption = None,
    ngl: TargetGpuLayersOption = None,
    ngl_draft: DraftGpuLayersOption = None,
    rpc: RpcOption = None,
    rpc_draft: RpcDraftOption = False,
    tensor_split: TensorSplitOption = None,
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
    remember: RememberOption = False,
    config: ConfigOption = None,
) -> None:
    """Chat with a pair: streamed replies colored by token origin, with live speculative-decoding statistics."""
    from speccli.chat.command import run_chat
    from speccli.core.sampling import SamplingParams
    from speccli.models.pair import PairRequest

    run_chat(
        PairRequest(
            pair=pair, target=target, draft=draft, config=tuple(config or ()), n_ctx=ctx, default_n_ctx=CHAT_CTX, n_threads=threads,
            target_n_gpu_layers=ngl, draft_n_gpu_layers=ngl_draft, rpc=rpc, rpc_draft=rpc_draft,
            tensor_split=tensor_split or (), spec=spec,
        ),
        sampling=SamplingParams(temperature, top_k, top_p, min_p),
        k=k,
        seed=seed,
        max_tokens=max_tokens,
        system=system,
        prompt=prompt,
        json_output=json_output,
        provenance=color_provenance,
        remember=remember,
    )
