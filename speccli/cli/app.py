"""The `speccli` Typer app: the commands (one module each in this package), and the one place that
turns every error a user can cause into one line and an exit code.

Exit codes: 0 done; 1 a SpeccliError (bad value, failed run); 2 a usage error or a file that cannot
be read; 3 bench's greedy check failed; 130 interrupted (Ctrl-C); 141 the reader of stdout went away;
143 terminated (SIGTERM, which unwinds as Ctrl-C does).
check-vocab and quant-check give 1 for their verdict (incompatible, any BROKEN), so every refusal
there is 2: a script must never read a typo as a verdict.
"""
from __future__ import annotations

import codecs
import os
import re
import sys
import traceback
from contextlib import contextmanager
from typing import Annotated, Any, Iterator, Sequence

import typer
from rich.console import Console
from typer.core import TyperGroup

from speccli import __version__
from speccli.cli import bench, chat, env, models, quant_check, remembered, rpc_server, serve, suggest, vocab
from speccli.errors import INTERRUPTED_EXIT_CODE, SpeccliError
from speccli.util.interrupts import exit_code_for_interrupt, sigterm_unwinds

# Typer raises Click's exceptions, from its own copy of Click in recent versions: typer.BadParameter
# is one of them either way, so its bases are the classes to catch.
_CLICK_EXCEPTION = next(base for base in typer.BadParameter.__mro__ if base.__name__ == "ClickException")

USAGE_ERROR = 2
READER_GONE = 141
VERDICT_COMMANDS = ("check-vocab", "quant-check")  # whose exit code 1 is a verdict (see the docstring)


class SpeccliGroup(TyperGroup):
    """Maps every known error to one line in one place; `--debug` or SPECCLI_DEBUG=1 shows the traceback."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Typer would draw usage errors (`chat --top-k abc`, `pull` without a name) as a boxed panel of
        several lines; here they are one line like every other error."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        _write_names_as_given()
        Console.on_broken_pipe = _reader_went_away
        try:
            with sigterm_unwinds():
                exit_code = super().main(*args, standalone_mode=False, **kwargs)
        except _CLICK_EXCEPTION as error:
            message = " ".join(error.format_message().split())
            context = getattr(error, "ctx", None)
            words = kwargs.get("args") or (args[0] if args else None) or sys.argv[1:]
            command_path = context.command_path if context is not None else self._command_path_in(words)
            if command_path is not None:
                message = f"{command_path}: {message} (see '{command_path} --help')"
            typer.echo(f"error: {message}", err=True)
            sys.exit(error.exit_code)
        except typer.Abort:  # Click's Ctrl-C at a prompt; a Ctrl-C elsewhere Typer turns into exit 130 itself
            sys.exit(exit_code_for_interrupt())
        if exit_code == INTERRUPTED_EXIT_CODE:
            exit_code = exit_code_for_interrupt()  # 143 where SIGTERM, not Ctrl-C, was the interrupt
        sys.exit(exit_code if isinstance(exit_code, int) else 0)

    def _command_path_in(self, words: Sequence[str]) -> str | None:
        """The command a usage error raised without its context belongs to (Click's parser raises
        `--remember=false`'s "does not take a value" so): the command line's first word, if a command."""
        word = next((word for word in words if not word.startswith("-")), None)
        return f"speccli {word}" if word in self.commands else None

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        """The top level writes to stdout as its line is read, before any command runs: `--help`,
        `--version` and bare `speccli`'s help. The same rules as a command's output apply to it."""
        with _errors_as_one_line(None):
            try:
                return super().make_context(info_name, args, parent, **extra)
            except (typer.Exit, _CLICK_EXCEPTION) as ending:
                if _is_bare_help(ending):  # Click's error for bare `speccli` carries the help, as its message
                    typer.echo(ending.format_message())
                    _require_stdout()
                    raise typer.Exit(ending.exit_code) from None
                if isinstance(ending, typer.Exit):  # it printed (help, versions)
                    _require_stdout()
                raise

    def invoke(self, ctx: typer.Context) -> Any:
        with _errors_as_one_line(ctx):
            # Every command, serve included: its output is on stderr, but uvicorn reads stdout as it starts.
            _require_stdout()
            return super().invoke(ctx)


def _is_bare_help(error: Exception) -> bool:
    return type(error).__name__ == "NoArgsIsHelpError"


def _require_stdout() -> None:
    """Python's stdout where the shell closed it (`>&-`) is None: every print would vanish, and exit 0."""
    if sys.stdout is None:
        typer.echo("error: stdout is closed, so the output would go nowhere", err=True)
        raise typer.Exit(USAGE_ERROR)


@contextmanager
def _errors_as_one_line(ctx: typer.Context | None) -> Iterator[None]:
    """Every error a user can cause, as one line and its exit code (that of the command `ctx` invoked,
    if any by then); a reader of stdout gone is exit 141 without a word."""
    try:
        yield
    except BrokenPipeError:
        # The reader went away (`speccli models | head`): nothing left to say to anyone.
        sys.stderr.close()
        raise typer.Exit(READER_GONE) from None
    except (SpeccliError, OSError) as error:
        if debugging():
            traceback.print_exc()  # then the same line and exit code as without it: scripts see no difference
        if isinstance(error, OSError) and error.filename is None and _raised_writing_stdout(error):
            error.filename = "stdout"  # `> /dev/full`: "No space left on device" alone named nothing
        typer.echo(f"error: {_one_line(error)}", err=True)
        code = getattr(error, "exit_code", USAGE_ERROR)
        if code == READER_GONE:  # said why (bench keeps its report): what stdout still holds goes nowhere
            _discard_stdout()
        command = ctx.invoked_subcommand if ctx is not None else None
        raise typer.Exit(USAGE_ERROR if code == 1 and command in VERDICT_COMMANDS else code) from None


def _raised_writing_stdout(error: OSError) -> bool:
    """Whether the write that failed was to stdout: the innermost frame (rich's or click's write, or
    our own) holds stdout, a console writing to it, or an object that writes to it (chat's reply)."""
    frame_traceback = error.__traceback__
    while frame_traceback is not None and frame_traceback.tb_next is not None:
        frame_traceback = frame_traceback.tb_next
    if frame_traceback is None or sys.stdout is None:
        return False

    def writes_to_stdout(value: object) -> bool:
        attributes = vars(value).values() if hasattr(value, "__dict__") else ()
        return value is sys.stdout or getattr(value, "file", None) is sys.stdout or any(a is sys.stdout for a in attributes)

    return any(writes_to_stdout(value) for value in frame_traceback.tb_frame.f_locals.values())


def debugging() -> bool:
    """`--debug`, or SPECCLI_DEBUG set to anything but empty, 0, false, no or off."""
    return os.environ.get("SPECCLI_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def _reader_went_away(console: Console) -> None:
    """What rich does when the reader of stdout goes away (`speccli bench | head`, `--help | head`),
    with speccli's exit code for it rather than rich's 1: the console falls silent and stdout goes to
    /dev/null, so that nothing fails again as the process ends. Set on the class, as rich means it to
    be overridden: Typer makes its own consoles for --help."""
    console.quiet = True
    _discard_stdout()
    raise SystemExit(READER_GONE)


def _discard_stdout() -> None:
    """stdout to /dev/null, its reader being gone: what is left in its buffer must not fail again, in
    words, as the process ends."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _write_names_as_given() -> None:
    """A file name that is not UTF-8 (`bad\\xffname.gguf`) reaches Python as surrogate escapes; on
    stdout and stderr (error lines, notices) they become the original bytes again, as `ls` prints them,
    rather than an encoding error in the middle of a report or, on stderr, a name that is on no disk
    (`bad\\udcffname.gguf`). Any other character the stream's encoding lacks is escaped, never an error."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=_AS_GIVEN)


_AS_GIVEN = "speccli-as-given"


def _bytes_as_given(error: UnicodeError) -> tuple[str | bytes, int]:
    """An encoding error handler: surrogate escapes (bytes that were not UTF-8) back to their bytes; the
    rest as Python's stderr writes them (`\\u00e9`)."""
    if isinstance(error, UnicodeEncodeError) and all("\udc80" <= c <= "\udcff" for c in error.object[error.start:error.end]):
        return codecs.lookup_error("surrogateescape")(error)
    return codecs.backslashreplace_errors(error)


codecs.register_error(_AS_GIVEN, _bytes_as_given)


_LINE_BREAKS = re.compile(r"\s*[\r\n]+\s*")


def _one_line(error: Exception) -> str:
    """SpeccliErrors are written for users already; an OSError (disk full, permission denied while
    writing a cache or report) gets its file and reason. Line breaks in text from elsewhere (another
    package's exception, llama.cpp's log) become spaces. A file name's bytes that are not UTF-8 are
    written as they are (see `_write_names_as_given`)."""
    if isinstance(error, OSError) and not isinstance(error, SpeccliError):
        where = f"{error.filename}: " if error.filename else ""
        message = f"{where}{error.strerror or error}"
    else:
        message = str(error)
    return _LINE_BREAKS.sub(" ", message).strip()


app = typer.Typer(
    cls=SpeccliGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: option, metavar and text on one line, readable at 80 columns
    help="Faster local GGUF generation by speculative decoding, with the target model's exact output distribution.",
)


def version_callback(value: bool) -> None:
    if value:
        from speccli.llama.build import backend_info

        info = backend_info()
        typer.echo(f"speccli {__version__}")
        typer.echo(f"llama-cpp-python {info.llama_cpp_python_version} ({info.summary})")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Show versions and backend.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    if debug:
        os.environ["SPECCLI_DEBUG"] = "1"


app.command()(chat.chat)
app.command()(bench.bench)
app.command("check-vocab")(vocab.check_vocab)
app.command()(models.models)
app.command()(models.pull)
app.command()(env.env)
app.command("quant-check")(quant_check.quant_check)
app.command()(serve.serve)
app.command("rpc-server")(rpc_server.rpc_server)
app.command()(suggest.suggest)
app.command()(remembered.remembered)


def main() -> None:
    app(prog_name="speccli")
