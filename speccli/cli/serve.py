"""`speccli serve`: an OpenAI-compatible HTTP server that decodes speculatively (speccli.server)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def serve(
    pair: Annotated[Optional[str], typer.Argument(help="A pair from models.toml (default: its default_pair).")] = None,
    target: Annotated[Optional[str], typer.Option("--target", "-m", help="Target model: registry name or GGUF path.")] = None,
    draft: Annotated[Optional[str], typer.Option("--draft", "-md", help="Draft model: registry name or GGUF path.")] = None,
    spec: Annotated[
        str, typer.Option("--spec", help="Drafting: model, ngram or ngram+model (ngram alone loads no draft model).")
    ] = "model",
    k: Annotated[str, typer.Option("--k", help="Draft tokens per target decode: 1 to 64, or auto.")] = "auto",
    host: Annotated[str, typer.Option("--host", help="Address to listen on (default: loopback only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one.")] = 8080,
    queue: Annotated[int, typer.Option("--queue", help="Requests that may wait while one runs; more get 503.")] = 16,
    ctx: Annotated[int, typer.Option("--ctx", "-c", help="Context window, in tokens, for both models.")] = 4096,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", help="CPU threads (default: all cores).")] = None,
    ngl: Annotated[Optional[int], typer.Option("--ngl", "-ngl", help="Target layers on the GPU.")] = None,
    ngl_draft: Annotated[Optional[int], typer.Option("--ngl-draft", "-ngld", help="Draft layers on the GPU.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="Extra models.toml.")] = None,
) -> None:
    """Serve a pair over an OpenAI-compatible HTTP API, decoding speculatively, until Ctrl-C."""
    from speccli.drafting.specs import parse_k
    from speccli.models.pair import PairRequest
    from speccli.server.launch import ServeSettings, bind, build_service, open_models, run_server

    settings = ServeSettings(host=host, port=port, spec=spec, k=parse_k(k), max_waiting=queue)
    settings.validate()
    request = PairRequest(pair, target, draft, config, ctx, threads, ngl, ngl_draft)
    request.validate()
    sock = bind(host, port)  # before loading: a port in use fails at once
    with open_models(request, spec) as (model_id, target_model, draft_model):
        service = build_service(model_id, target_model, draft_model, settings)
        k_text = "auto" if settings.k is None else settings.k
        run_server(service, sock, lambda url: typer.echo(
            f"serving {model_id} (--spec {spec}, --k {k_text}) at {url}/v1 · Ctrl-C stops", err=True))
