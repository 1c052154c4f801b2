"""`speccli serve`: options -> a pair request and server settings -> `speccli.server.launch`."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from speccli.cli.options import KOption, RememberOption, SpecOption, checked, with_pair_options
from speccli.validation import API_KEY_VARIABLE, CHAT_CTX, DEFAULT_PARALLEL, api_key_for, check_api_key

if TYPE_CHECKING:
    from speccli.models.pair import PairRequest


@with_pair_options(default_n_ctx=CHAT_CTX)
def serve(
    pair_request: PairRequest,
    spec: SpecOption = None,
    k: KOption = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (default: loopback only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one.")] = 8080,
    parallel: Annotated[int, typer.Option(
        "--parallel", "-np", help="Requests generated at once, their decodes batched; --ctx is split between them.",
    )] = DEFAULT_PARALLEL,
    queue: Annotated[int, typer.Option("--queue", help="Requests that may wait while the slots run (0: none); more get 503.")] = 16,
    api_key: Annotated[
        Optional[str],
        typer.Option(
            "--api-key", metavar="KEY", callback=checked(check_api_key),
            help=f"Answer 401 to any request but GET /health without 'Authorization: Bearer KEY' (default: "
            f"{API_KEY_VARIABLE}, which keeps the key out of `ps`; neither: no key).",
        ),
    ] = None,
    remember: RememberOption = None,
) -> None:
    """Serve a pair over an OpenAI-compatible HTTP API, decoding speculatively, until Ctrl-C."""
    from speccli.server.launch import ServeSettings, bind, build_service, exposure_warning, open_models, run_server

    api_key = api_key_for(api_key)
    ServeSettings(host=host, port=port, max_waiting=queue, parallel=parallel).validate()
    request = replace(pair_request, spec=spec, n_seq=parallel)
    request.validate()
    sock = bind(host, port)  # before loading: a port in use fails at once
    if (warning := exposure_warning(host, sock.getsockname()[0], api_key)) is not None:
        typer.echo(warning, err=True)
    with open_models(request) as (model_id, loaded):
        resolved = loaded.resolved
        settings = ServeSettings(
            host=host, port=port, spec=resolved.spec, k=resolved.k if k is None else k, max_waiting=queue, parallel=parallel,
            api_key=api_key, remember=resolved.remember if remember is None else remember,
            aliases=(resolved.name,) if resolved.name else (),
        )
        service = build_service(model_id, loaded.target, loaded.draft, settings)
        if (why := service.plain_transcript_reason) is not None:  # as chat says it
            typer.echo(f"note: {why}: chat completions use a plain 'User:'/'Assistant:' transcript, each reply "
                       "ending at the next 'User:'", err=True)
        # llama.cpp may round a small --ctx up (64 becomes 256): say what requests get.
        slots = f"{parallel} slots of " if parallel > 1 else ""
        context = f"{slots}{loaded.target.n_ctx_seq}-token context{', API key required' if api_key else ''}"
        run_server(service, sock, lambda url: typer.echo(
            f"serving {model_id} (--spec {settings.spec}, --k {settings.k}, {context}) at {url}/v1 · Ctrl-C stops", err=True))
