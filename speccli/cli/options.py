"""Options shared by several commands, each defined once and checked as it is parsed.

A checked option runs its `speccli.validation` check while the command line is read, so a bad value
is one line before anything is resolved, downloaded or loaded; chat's slash commands and
models.toml use the same checks. llama.cpp's short names are accepted as aliases.
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from speccli import validation
from speccli.drafting.registry import DEFAULT_SPEC, check_spec, spec_help


def checked(check: Callable[[Any, str], Any]) -> Callable[[typer.Context, typer.CallbackParam, Any], Any]:
    """A Click callback running `check` on the value under the option's own name (`--temp`). The
    command gets what `check` returns: a parser's value (`parse_k`: a K), never the text again. An
    option not given stays None, which means "not given" and nothing else."""

    def callback(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if value is None or ctx.resilient_parsing:
            return value
        return check(value, param.opts[0])

    return callback


def given_path(hint: str) -> Callable[[Any], Path]:
    """A parser for a path option (`parser=`): Typer's own Path reads '' as '.', the folder it runs in,
    so an empty one is refused here, naming what to give (Click names the option)."""

    def parse(value: Any) -> Path:
        if not str(value).strip():
            raise typer.BadParameter(f"empty; give {hint}")
        return Path(value)

    return parse


ConfigOption = Annotated[
    Optional[list[Path]],
    typer.Option("--config", metavar="FILE", parser=given_path("a models.toml"), help="Extra models.toml, read after the shipped and user files (overrides them); "
                                  "given more than once, each overrides the ones before it."),
]
PairArgument = Annotated[Optional[str], typer.Argument(metavar="PAIR", help="A pair from models.toml (default: its default_pair).")]
TargetOption = Annotated[
    Optional[str], typer.Option("--target", "-m", metavar="MODEL", help="Target model: registry name or GGUF path (overrides the pair's).")
]
DraftOption = Annotated[
    Optional[str], typer.Option("--draft", "-md", metavar="MODEL", help="Draft model: registry name or GGUF path (overrides the pair's).")
]
SpecOption = Annotated[
    Optional[str],
    typer.Option(
        "--spec", metavar="SOURCE",
        help=f"Draft source: {spec_help()} (default: the pair's, else {DEFAULT_SPEC}).",
        callback=checked(check_spec),
    ),
]


RememberOption = Annotated[
    Optional[bool],
    typer.Option(
        "--remember/--no-remember", show_default=False,
        help="Keep earlier replies, which the suffix draft source drafts from, in speccli's cache for the next runs "
        "(the file holds your generated text; `speccli remembered` lists and clears it; default: the pair's remember).",
    ),
]


# Click reads --k as text (Typer takes no union type); the callback hands the command a `validation.K`,
# or None where --k was not given (the pair's k then).
KOption = Annotated[
    Optional[str],
    typer.Option(
        "--k", metavar="K",
        help="Draft tokens per step: auto (chosen per step from measured costs) or 1 to 64 (default: the pair's, else auto).",
        callback=checked(validation.parse_k),
    ),
]
TemperatureOption = Annotated[
    float, typer.Option("--temp", help="Sampling temperature; 0 is greedy.", callback=checked(validation.check_temperature))
]
TopKOption = Annotated[
    int, typer.Option("--top-k", help="Keep the k most likely tokens; 0 keeps all.", callback=checked(validation.check_top_k))
]
TopPOption = Annotated[
    float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].", callback=checked(validation.check_top_p))
]
MinPOption = Annotated[
    float,
    typer.Option(
        "--min-p", help="Drop tokens below min-p times the top probability.", callback=checked(validation.check_min_p)
    ),
]
MaxTokensOption = Annotated[
    int,
    typer.Option("--max-tokens", "-n", help="Most tokens to generate per reply.", callback=checked(validation.check_max_tokens)),
]
ContextOption = Annotated[
    Optional[int],
    typer.Option(
        "--ctx", "-c",
        help=f"Context window, in tokens, for both models, at most what they were trained with (default: "
        f"{validation.CHAT_CTX} for chat and serve, {validation.BENCH_CTX} for bench and quant-check, or less where a "
        "model was trained with less).",
        callback=checked(validation.check_ctx),
    ),
]
ThreadsOption = Annotated[
    Optional[int],
    typer.Option("--threads", "-t", help="CPU threads (default: all cores).", callback=checked(validation.check_threads)),
]
TargetGpuLayersOption = Annotated[
    Optional[int],
    typer.Option(
        "--ngl", "-ngl",
        help="Target layers on the GPU, -1 for all (default: the pair's, else all).",
        callback=checked(validation.check_gpu_layers),
    ),
]
DraftGpuLayersOption = Annotated[
    Optional[int],
    typer.Option(
        "--ngl-draft", "-ngld",
        help="Draft layers on the GPU, -1 for all (default: the pair's, else all).",
        callback=checked(validation.check_gpu_layers),
    ),
]

# The target over llama.cpp's RPC backend (docs/rpc.md). Click reads text; the callbacks hand on the parsed value.
def rpc_option(help: str) -> Any:
    return typer.Option("--rpc", metavar="HOST:PORT[,...]", help=help, callback=checked(validation.parse_endpoints))


RpcOption = Annotated[
    Optional[str],
    rpc_option("Put the target's layers on these `speccli rpc-server`s (or llama.cpp rpc-servers), split by their "
               "memory; the draft stays here (default: the pair's rpc, else none)."),
]
RpcDraftOption = Annotated[
    bool, typer.Option("--rpc-draft", help="Put the draft model on the --rpc servers too (default: it runs here).")
]
TensorSplitOption = Annotated[
    Optional[str],
    typer.Option(
        "--tensor-split", "-ts", metavar="SHARES",
        help="The target's share on each device, in order (the --rpc servers, then local GPUs), e.g. 3,1 "
        "(default: by free memory).",
        callback=checked(validation.parse_tensor_split),
    ),
]


# The options that choose and place a pair, shared by chat, serve and bench: `with_pair_options` adds
# them to a command, which receives them as one `PairRequest` (its `spec` is the command's own).
PAIR_FIRST = {"pair": PairArgument, "target": TargetOption, "draft": DraftOption}
PAIR_LAST = {
    "ctx": ContextOption, "threads": ThreadsOption, "ngl": TargetGpuLayersOption, "ngl_draft": DraftGpuLayersOption,
    "rpc": RpcOption, "rpc_draft": RpcDraftOption, "tensor_split": TensorSplitOption, "config": ConfigOption,
}


def with_pair_options(default_n_ctx: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator: the command's signature gains the pair options (the pair argument, --target and --draft
    after a leading typer.Context, the placement options last), and the command is called with
    `pair_request`, a `PairRequest` built from them, in their place."""

    def option(name: str, annotation: Any) -> inspect.Parameter:
        default = False if name == "rpc_draft" else None
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [  # the command's own options, their annotations evaluated as Typer would (`pair_request`'s is not read)
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=eval(p.annotation, command.__globals__))
            for p in inspect.signature(command).parameters.values() if p.name != "pair_request"
        ]
        leading = 1 if own and own[0].annotation is typer.Context else 0
        parameters = [*own[:leading], *(option(n, a) for n, a in PAIR_FIRST.items()), *own[leading:],
                      *(option(n, a) for n, a in PAIR_LAST.items())]

        @functools.wraps(command)
        def wrapper(**given: Any) -> None:
            from speccli.models.pair import PairRequest

            shared = {name: given.pop(name) for name in (*PAIR_FIRST, *PAIR_LAST)}
            request = PairRequest(
                pair=shared["pair"], target=shared["target"], draft=shared["draft"], config=tuple(shared["config"] or ()),
                n_ctx=shared["ctx"], default_n_ctx=default_n_ctx, n_threads=shared["threads"],
                target_n_gpu_layers=shared["ngl"], draft_n_gpu_layers=shared["ngl_draft"], rpc=shared["rpc"],
                rpc_draft=shared["rpc_draft"], tensor_split=shared["tensor_split"] or (),
            )
            command(pair_request=request, **given)

        wrapper.__signature__ = inspect.Signature(parameters)  # what Typer reads the options from
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper

    return decorate


JsonSchemaOption = Annotated[
    Optional[str],
    typer.Option("--json-schema", metavar="FILE|JSON",
                 help="Every reply is JSON following this schema: a file holding it, or the schema itself ('{...}'). "
                      "Tokens the schema forces are drafted for free (source \"grammar\")."),
]
GrammarOption = Annotated[
    Optional[Path],
    typer.Option("--grammar", metavar="FILE", parser=given_path("a grammar's file"), help="Every reply follows this grammar: GBNF (llama.cpp's) or Lark (llguidance's)."),
]


def grammar_spec(json_schema: str | None, grammar: Path | None) -> Any:
    """--json-schema or --grammar as a checked GrammarSpec (None: neither), read and compiled before any
    model loads: a missing file, invalid JSON or a schema that cannot be compiled is one line, exit 2."""
    import json

    from speccli.core.constraint import GrammarSpec, check_grammar
    from speccli.errors import UsageError, unreadable
    from speccli.util.files import read_text_input

    if json_schema is not None and grammar is not None:
        raise UsageError("--json-schema and --grammar: give one of them")
    if json_schema is None and grammar is None:
        return None
    if json_schema is not None and not json_schema.strip():
        raise UsageError("--json-schema: empty; give a schema's file, or the schema as JSON")

    def read(path: Path, option: str) -> str:
        try:
            data = read_text_input(path, f"{option} {path}")
        except OSError as error:
            raise unreadable(f"{option} {path}", error, "text file") from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{option} {path}: not UTF-8 text") from None

    if grammar is not None:
        spec = GrammarSpec("grammar", read(grammar, "--grammar"), f"--grammar {grammar}")
    else:
        # the schema itself: an object, or other JSON that names no file ('[1, 2]': refused as no object)
        inline = json_schema.lstrip().startswith("{") or not Path(json_schema).exists() and _is_json(json_schema)
        text = json_schema if inline else read(Path(json_schema), "--json-schema")
        name = "--json-schema" if inline else f"--json-schema {json_schema}"
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as error:
            raise UsageError(f"{name}: not valid JSON: {error}") from None
        spec = GrammarSpec.json_schema(schema, name)
    check_grammar(spec)
    return spec


def _is_json(text: str) -> bool:
    import json

    try:
        json.loads(text)
    except ValueError:
        return False
    return True
