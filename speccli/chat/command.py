"""`speccli chat` run: where its messages come from (typed at a terminal, piped, or `--prompt`), each
read as text the models can take, and how the session ends (exit status, Ctrl-C, a closed stdin)."""
from __future__ import annotations

import itertools
import sys
from typing import Iterator

from rich.console import Console

from speccli.chat.session import ChatSession
from speccli.chat.view import Display, Mode
from speccli.core.constraint import GrammarSpec
from speccli.core.sampling import SamplingParams
from speccli.errors import SpeccliError, UsageError
from speccli.models.pair import PairRequest, open_pair
from speccli.remembered.stores import open_store
from speccli.util.interrupts import terminated
from speccli.validation import K


def as_text(data: str | bytes) -> tuple[str, bool]:
    """A message as the models will see it, and whether it had to be repaired.

    Bytes that are not UTF-8 (in piped input, or in an argument, which Python hands over as
    surrogate escapes) each become U+FFFD, the replacement character, rather than ending the
    session; the caller says so.
    """
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogateescape")
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), True


def typed_lines(display: Display) -> Iterator[str]:
    """Messages typed at a terminal, until Ctrl-D or Ctrl-C. A paste of several lines is one message,
    sent with Enter, where the terminal marks pastes (bracketed paste; most do)."""
    import readline  # input() then gets line editing and history

    # Python turns readline's bracketed paste off (it printed escapes where stdout is no terminal);
    # input() uses readline only where both ends are one. Without it, each pasted line was a turn.
    readline.parse_and_bind("set enable-bracketed-paste on")

    while True:
        try:
            line, repaired = as_text(input("> "))
        except (EOFError, KeyboardInterrupt):
            print()
            if terminated():
                raise KeyboardInterrupt from None  # SIGTERM: not a chat's usual end, so exit 143
            return
        if repaired:
            display.notice(_REPAIRED)
        yield line


def first_piped_line() -> bytes:
    """Piped stdin's first line that is not blank, read before seconds of model loading: stdin that
    holds none is refused then (as an empty `--prompt -` is), not after the models loaded."""
    for raw in sys.stdin.buffer:
        if raw.strip():
            return raw
    raise SpeccliError("no message was piped in (stdin ended before a line that is not blank)")


def piped_lines(display: Display, first: bytes) -> Iterator[str]:
    """Piped stdin, one message per line (`first` before them), read as bytes so that one bad line
    costs nothing else."""
    for raw in itertools.chain([first], sys.stdin.buffer):
        line, repaired = as_text(raw)
        if line.strip():
            display.echo_user(line.strip())
            if repaired:
                display.notice(_REPAIRED)
            yield line


_REPAIRED = "(the message had bytes that are not UTF-8; each became U+FFFD)"


def one_message(prompt: str, display: Display) -> str:
    """The message `--prompt` names ('-': all of stdin but the newline ending its last line, as `echo`
    writes it), refused when empty, like an empty line."""
    text, repaired = as_text(sys.stdin.buffer.read() if prompt == "-" else prompt)
    if prompt == "-":
        text = text.removesuffix("\n").removesuffix("\r")
    if not text.strip():
        raise SpeccliError("the prompt read from stdin (--prompt -) is empty" if prompt == "-" else "the prompt (--prompt) is empty")
    if repaired:
        display.notice(_REPAIRED)
    return text


def run_chat(
    request: PairRequest,
    *,
    sampling: SamplingParams,
    k: K | None,  # --k, parsed; None: not given (the pair's k)
    seed: int | None,
    max_tokens: int,
    system: str | None,
    prompt: str | None,
    json_output: bool,
    provenance: bool,
    remember: bool | None = None,  # --remember/--no-remember; None: the pair's
    grammar: GrammarSpec | None = None,  # --json-schema or --grammar, checked: every reply follows it
) -> None:
    """`--prompt`: one reply, errors fatal. Otherwise typed lines (a terminal) or piped lines, one turn each.

    The settings were checked as the command line was read; the message is read (and checked) before
    seconds of model loading.
    """
    request.validate()
    _require_stdin(prompt)
    display = Display(_output_mode(json_output), provenance=provenance)
    message = one_message(prompt, display) if prompt is not None else None
    piped = None if prompt is not None or sys.stdin.isatty() else first_piped_line()
    if system is not None:
        system, _ = as_text(system)
    with open_pair(request) as pair:
        store = open_store(pair.target.tokenizer, pair.resolved.target_name, pair.resolved.remember if remember is None else remember, display.warning)
        session = ChatSession(
            pair.target, pair.draft, display,
            sampling=sampling, spec=pair.resolved.spec, k=pair.resolved.k if k is None else k,
            seed=seed, max_tokens=max_tokens, system=system, one_shot=message is not None, store=store,
            grammar=grammar,
        )
        try:
            resolved = pair.resolved
            remote = "RPC" in pair.target.placement or (pair.draft is not None and "RPC" in pair.draft.placement)
            target_place = f" on {pair.target.placement}" if remote else ""
            draft_place = f" on {pair.draft.placement}" if remote and pair.draft is not None else ""
            drafting = f"draft {resolved.draft_name}{draft_place}" if resolved.draft_name else "no draft model"
            session.announce(
                f"target {resolved.target_name}{target_place} · {drafting} · spec {resolved.spec} · k={session.generator.policy.name}"
                + ("" if grammar is None else f" · replies follow {grammar.name}")
            )
            if message is not None:
                session.send(message)
                if session.finish_reason == "interrupted":  # printed, but a script must not take it for a whole reply
                    raise KeyboardInterrupt
            elif sys.stdin.isatty():
                session.run(typed_lines(display))
            else:
                failed = session.run(piped_lines(display, piped), stopping_ends=True)
                if session.finish_reason == "interrupted":  # a script must not take the replies for all it sent
                    raise KeyboardInterrupt
                if failed:  # a script feeding chat must see that lines failed
                    raise SpeccliError(f"{failed} piped line{'s' if failed > 1 else ''} failed (each said why above)")
        finally:
            store.close()  # what this session added: written at the end whatever ended it
            session.learnt.keep(session.generator.policy, session.generator.sampling, now=True, costs=session.costs)


def _require_stdin(prompt: str | None) -> None:
    """Python's stdin where the shell closed it (`<&-`) is None: refused before any model loads, where
    the messages were to come from it."""
    if sys.stdin is not None or (prompt is not None and prompt != "-"):
        return
    if prompt == "-":
        raise UsageError("stdin is closed, so there is no message to read (--prompt -); give it with --prompt TEXT")
    raise UsageError("stdin is closed, so there are no messages to read; give one with --prompt, or pipe them in")


def _output_mode(json_output: bool) -> Mode:
    if json_output:
        return "json"
    return "terminal" if Console().is_terminal else "plain"
