"""Chat: turns formatted with the target's own chat template, one Generator kept across turns.

KV reuse. The Generator keeps both models' KV caches and re-decodes only past the longest common
token prefix of its last sequence and the new prompt. So each turn's prompt must *start with the
exact tokens* the models already saw: the previous prompt and the reply tokens as generated.
Re-tokenizing the whole transcript would not guarantee that (a reply's tokens need not be how the
tokenizer would split its text), so the conversation keeps its token list and the text it stands
for, renders the whole transcript, and tokenizes only the text past what was already fed. When the
rendering does not extend that text (a template that trims replies, a stop string cut mid-token),
the transcript is tokenized whole and the Generator still reuses whatever prefix matches.

Context policy. Before a turn, the prompt must leave room for a reply of min(max_tokens, ctx/4)
tokens. If it does not, the oldest turns (a user message and its reply) are dropped, oldest first,
the system prompt always kept, and the shortened transcript is tokenized whole and prefilled again
(the prefix changed, so no cache can be reused past the system prompt). A message that does not fit
even alone is refused with one line. A reply that fills the context stops with a notice; the next
turn then drops old turns as above.
"""
from __future__ import annotations

import sys
import time
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from speccli.llama.model import Model, naming_non_finite_logits, shared_context
from speccli.llama.tokenizer import Tokenizer
from speccli.chat.template import ChatFormat, Message, chat_format_for, tokenize_rendered
from speccli.chat.view import Display, Mode
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.stats import DoneEvent, RunStats, Source, StepEvent, TokenEvent
from speccli.core.text import begins_a_stop
from speccli.errors import SpeccliError, UsageError
from speccli.core.sampling import SamplingParams, probabilities, sample
from speccli.models.pair import PairRequest, open_pair
from speccli.core.seam import ReplyDrafting
from speccli.drafting.specs import make_drafter, make_policy
from speccli.util.interrupts import ctrl_c_as_flag, terminated
from speccli.util.sequences import common_prefix_length
from speccli.validation import K, MAX_K, check_max_tokens, check_temperature, parse_k

COMMANDS = {
    "/stats": "statistics for the whole session so far",
    "/reset": "forget the conversation (the system prompt stays)",
    "/k N|auto": f"draft tokens per step: 1 to {MAX_K}, or auto (chosen per step from measured costs)",
    "/temp X": "sampling temperature; 0 is greedy",
    "/system TEXT": "set the system prompt (shows it without TEXT; /system clear removes it)",
    "/provenance": "toggle coloring tokens by origin",
    "/help": "this list",
    "/quit": "leave with a summary (also Ctrl-D, or Ctrl-C at the prompt)",
}


# --- the conversation and its tokens --------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str  # what the tokens stand for: the whole rendered transcript


class Conversation:
    """The messages, plus the exact tokens the models have been shown for them (see module docstring)."""

    def __init__(self, tokenizer: Tokenizer, chat_format: ChatFormat, system: str | None) -> None:
        self.tokenizer = tokenizer
        self.format = chat_format
        self.system = system
        self.turns: list[tuple[Message, Message]] = []  # (user, assistant)
        self._fed_tokens: list[int] = []
        self._fed_text = ""

    def messages(self) -> list[Message]:
        messages = self._system_messages()
        for user, assistant in self.turns:
            messages += [user, assistant]
        return messages

    def prompt_for(self, user_text: str) -> Prompt:
        text = self.format.render(self.messages() + [{"role": "user", "content": user_text}])
        if self._fed_tokens and text.startswith(self._fed_text):
            new_text = text[len(self._fed_text) :]
            tokens = self._fed_tokens + self.tokenizer.tokenize(new_text, False, self.format.parse_special)
        else:
            tokens = tokenize_rendered(self.tokenizer, self.format, text)
        return Prompt(tokens, text)

    def prompt_alone(self, user_text: str) -> Prompt:
        """The prompt for `user_text` with every earlier turn left out (the system prompt kept)."""
        messages = self._system_messages() + [{"role": "user", "content": user_text}]
        text = self.format.render(messages)
        return Prompt(tokenize_rendered(self.tokenizer, self.format, text), text)

    def _system_messages(self) -> list[Message]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def add_turn(self, user_text: str, prompt: Prompt, reply_tokens: list[int], reply_text: str) -> None:
        """Record a finished (or interrupted) reply. The end-of-turn token, if any, is not kept: the
        template writes it again next turn, and the Generator finds the same token already cached."""
        self.turns.append(({"role": "user", "content": user_text}, {"role": "assistant", "content": reply_text}))
        self._fed_tokens = prompt.tokens + reply_tokens
        self._fed_text = prompt.text + self.tokenizer.detokenize(reply_tokens).decode("utf-8", "replace")

    def drop_oldest_turn(self) -> None:
        del self.turns[0]
        self._forget_tokens()

    def set_system(self, system: str | None) -> None:
        self.system = system
        self._forget_tokens()

    def clear(self) -> None:
        self.turns.clear()
        self._forget_tokens()

    def _forget_tokens(self) -> None:
        """The transcript's beginning changed: the next prompt is tokenized whole."""
        self._fed_tokens, self._fed_text = [], ""


# --- a chat session ---------------------------------------------------------------------------


def measure_target_token_seconds(target: Model, sampling: SamplingParams, repeats: int = 5) -> float:
    """What one token costs the target alone: a 1-token decode (`Model.time_decode`, the cost probe) and
    one sample from its logits.

    Speculation's benefit is measured against this (see display.estimated_speedup). Each part is the
    least of `repeats` timings after a warm-up: what else the machine does only ever lengthens a
    timing, and on a loaded machine slow ones had made a session's estimate 49x at an acceptance of 0%.
    The cache is left as it was. At position 0 it slightly underestimates the cost deep in a long
    context, where attention costs more.
    """
    token = max(target.tokenizer.bos_id, 0)
    decode_seconds = min([target.time_decode([token], n_logit_rows=1) for _ in range(repeats + 1)][1:])
    start = target.n_past
    logits = target.decode([token], n_logit_rows=1)
    rng = np.random.default_rng(0)
    sample_seconds = []
    try:
        for _ in range(repeats + 1):
            started = time.perf_counter()
            sample(probabilities(logits, sampling)[0], rng)
            sample_seconds.append(time.perf_counter() - started)
    finally:
        target.truncate(start)
    return decode_seconds + min(sample_seconds[1:])


def no_pay_notice(drafting: ReplyDrafting) -> str:
    """What chat says once where `auto` chose no draft in a reply: only the target's own speed is on offer."""
    why = "by the costs measured on this machine and the acceptance seen so far, no draft would pay here"
    if not drafting.rechecks:
        return f"(k auto drafted nothing: {why}, so the reply came from the target alone, at its own speed)"
    steps = f"{drafting.rechecks} step{'s' if drafting.rechecks > 1 else ''}"
    return (f"(k auto drafted only to re-check a source it had ruled out, in {steps}: {why}, so the rest of "
            "the reply came from the target alone, at its own speed)")


class ChatSession:
    def __init__(
        self,
        target: Model,
        draft: Model | None,
        display: Display,
        *,
        sampling: SamplingParams,
        spec: str,
        k: K,
        seed: int | None = None,
        max_tokens: int = 512,
        system: str | None = None,
        one_shot: bool = False,
    ) -> None:
        check_max_tokens(max_tokens, "max tokens")
        self.one_shot = one_shot  # `--prompt`: one reply, then the process ends (no next turn to speak of)
        self.spec = spec
        self.draft = draft
        self.generator = Generator(target, make_drafter(spec, draft), sampling, make_policy(k), seed)
        self.display = display
        self.max_tokens = max_tokens
        chat_format, self.fallback_reason = chat_format_for(target.tokenizer)
        self.conversation = Conversation(target.tokenizer, chat_format, system)
        self.n_ctx = shared_context(target, draft)
        with naming_non_finite_logits(target, draft):  # it samples from the target's logits
            self.target_token_seconds = measure_target_token_seconds(target, sampling)
        self.totals = RunStats()
        self.replies = 0
        self.finish_reason: str | None = None  # the last reply's ("stop", "max_tokens", "interrupted", ...)
        self._said_no_pay = False

    def announce(self, description: str) -> None:
        if self.fallback_reason:
            self.display.notice(
                f"{self.fallback_reason}: using a plain 'User:'/'Assistant:' transcript, "
                "each reply ending at the next 'User:'"
            )
        if self.display.mode == "terminal":
            self.display.notice(f"{description} · /help for commands · Ctrl-C stops a reply · Ctrl-D leaves")
            self.display.legend()

    def run(self, lines: Iterator[str], *, stopping_ends: bool = False) -> int:
        """One turn per message (a typed line, a pasted block, a piped line); slash commands in between.
        Errors are shown and the session goes on; returns how many lines failed. Where `stopping_ends`
        (piped lines: no one is there to type the next message), a reply stopped by Ctrl-C ends the
        session, as a Ctrl-C while the next line is awaited does: `finish_reason` then says
        "interrupted". Either way the session's statistics are shown first (not on SIGTERM)."""
        failed = 0
        try:
            for line in lines:
                text = line.strip()
                if not text:
                    continue
                try:
                    if text.startswith("/"):
                        if not self.command(text):
                            break
                    else:
                        self.send(text)
                        if stopping_ends and self.finish_reason == "interrupted":
                            break
                except SpeccliError as error:
                    self.display.error(str(error))
                    failed += 1
        except KeyboardInterrupt:
            if not terminated():  # SIGTERM asks the process to end, not to report
                self.farewell()
            raise
        self.farewell()
        return failed

    def farewell(self) -> None:
        if self.replies:
            self.display.session_stats(self.totals, self.target_token_seconds, self._session_title())

    def _session_title(self) -> str:
        return f"session: {self.replies} repl{'y' if self.replies == 1 else 'ies'}"

    def send(self, user_text: str) -> str:
        """Generate and show one reply; returns its text."""
        prompt = self._prompt_that_fits(user_text)
        reused = self.generator.reused_prefix(prompt.tokens)
        reply_tokens: list[int] = []
        pieces: list[str] = []
        reason = "interrupted"
        source = Source.TARGET
        limits = GenerationLimits(self.max_tokens, self.conversation.format.stop)
        with (
            naming_non_finite_logits(self.generator.target, self.draft),
            self.display.reply(self.target_token_seconds) as view,
            ctrl_c_as_flag() as interrupted,
            closing(self.generator.generate(prompt.tokens, limits, interrupted)) as events,
        ):
            # A Ctrl-C ends the events between two steps (or in the prefill, before any): no DoneEvent.
            for event in events:
                if isinstance(event, TokenEvent):
                    source = event.source
                    reply_tokens.append(event.token)
                    pieces.append(event.text)
                    view.add(event.text, source)
                elif isinstance(event, StepEvent):
                    view.update(self.generator.reply_stats)
                elif isinstance(event, DoneEvent):
                    reason = event.reason
                    # Text held back as it may begin the format's end-of-turn marker: a reply cut there
                    # (--max-tokens, a full context) had stopped writing its text ("Hey\nUser").
                    trailing = "" if begins_a_stop(event.trailing_text, limits.stop) else event.trailing_text
                    pieces.append(trailing)
                    view.add(trailing, source)
        run = self.generator.reply_stats  # complete, or as far as an interrupted reply got
        reply_text = "".join(pieces)
        # The prompt tokens decoded, up to where a Ctrl-C stopped the prefill: the generator's tokens
        # follow what the caches hold.
        prefill_tokens = common_prefix_length(self.generator.tokens, prompt.tokens) - 1 - reused
        # A message stopped before its reply showed a token is not kept, nor counted as a reply: sent
        # again, it would be in the conversation (and the session's figures) twice.
        kept = bool(reply_tokens) or reason != "interrupted"
        if kept:
            self.conversation.add_turn(user_text, prompt, reply_tokens, reply_text)
            self.totals = self.totals + run
            self.replies += 1
        self.finish_reason = reason
        if reason == "interrupted":
            what_stays = "the partial reply stays in the conversation" if kept else "the message is not kept"
            self.display.notice("(stopped)" if self.one_shot else f"(stopped; {what_stays})")
        elif reason == "context":
            next_turn = "" if self.one_shot else "; the next turn drops the oldest turns"
            self.display.notice(f"(the {self.n_ctx}-token context is full: reply cut{next_turn})")
        elif reason == "max_tokens":
            self.display.notice(f"(reply cut at {self.max_tokens} tokens: --max-tokens)")
        drafting = self.generator.policy.reply
        if run.steps and drafting is not None and not drafting.chosen and not self._said_no_pay:
            self._said_no_pay = True
            self.display.notice(no_pay_notice(drafting))
        record = {
            "prompt": user_text, "reply": reply_text, "finish_reason": reason, "prefill_tokens": prefill_tokens,
            "spec": self.spec,
            "k": self.generator.policy.name,
        }
        self.display.reply_done(record, run, self.target_token_seconds)
        return reply_text

    def _prompt_that_fits(self, user_text: str) -> Prompt:
        reserve = min(self.max_tokens, self.n_ctx // 4)
        prompt = self.conversation.prompt_for(user_text)
        if len(prompt.tokens) + reserve > self.n_ctx and self.conversation.turns:
            # A message that cannot fit even alone is refused before any turn is dropped for it.
            self._refuse_if_too_long(self.conversation.prompt_alone(user_text))
        dropped = 0
        while len(prompt.tokens) + reserve > self.n_ctx and self.conversation.turns:
            self.conversation.drop_oldest_turn()
            dropped += 1
            prompt = self.conversation.prompt_for(user_text)
        if dropped:
            self.display.notice(
                f"(context: dropped the {_oldest_turns(dropped)} to fit the "
                f"{self.n_ctx}-token context, system prompt kept; re-reading {len(prompt.tokens)} tokens)"
            )
        self._refuse_if_too_long(prompt)
        return prompt

    def _refuse_if_too_long(self, prompt: Prompt) -> None:
        if len(prompt.tokens) >= self.n_ctx:
            alongside = "with the system prompt" if self.conversation.system else "as the chat format frames it"
            raise SpeccliError(
                f"this message needs {len(prompt.tokens)} tokens {alongside}, and its reply one more, but "
                f"the context holds {self.n_ctx}; shorten it or raise --ctx"
            )

    def command(self, line: str) -> bool:
        """Run one slash command; False means leave."""
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            for usage, meaning in COMMANDS.items():
                self.display.notice(f"{usage:<14} {meaning}")
        elif name == "/stats":
            self.display.session_stats(self.totals, self.target_token_seconds, self._session_title())
        elif name == "/reset":
            self.conversation.clear()
            self.generator.reset()
            self.display.notice("(conversation cleared)")
        elif name == "/k":
            self.generator.policy = make_policy(parse_k(argument, "/k"))
            self.display.notice(f"(k = {self.generator.policy.name})")
        elif name == "/temp":
            sampling = replace(self.generator.sampling, temperature=check_temperature(_parse_float("/temp", argument), "/temp"))
            self.generator.sampling = sampling
            self.display.notice(f"(temperature = {sampling.temperature:g}{', greedy' if sampling.greedy else ''})")
        elif name == "/system":
            if argument == "clear":
                self.conversation.set_system(None)
                self.display.notice("(system prompt removed; the next turn re-reads the conversation)")
            elif argument:
                self.conversation.set_system(argument)
                self.display.notice("(system prompt set; the next turn re-reads the conversation)")
            else:
                self.display.notice(f"(system prompt: {self.conversation.system or 'none'})")
        elif name == "/provenance":
            self.display.provenance = not self.display.provenance
            self.display.notice(f"(provenance colors {'on' if self.display.provenance else 'off'})")
            self.display.legend()
        else:
            known = ", ".join(usage.split()[0] for usage in COMMANDS)
            raise SpeccliError(f"unknown command {name}; known: {known}")
        return True


def _oldest_turns(count: int) -> str:
    return "oldest turn" if count == 1 else f"{count} oldest turns"


def _parse_float(command: str, argument: str) -> float:
    try:
        return float(argument)
    except ValueError:
        got = f"got {argument!r}" if argument else "and none was given"
        raise SpeccliError(f"{command} needs a number, {got}") from None


# --- the command --------------------------------------------------------------------------------


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


def piped_lines(display: Display) -> Iterator[str]:
    """Piped stdin, one message per line, read as bytes so that one bad line costs nothing else."""
    for raw in sys.stdin.buffer:
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
) -> None:
    """`--prompt`: one reply, errors fatal. Otherwise typed lines (a terminal) or piped lines, one turn each.

    The settings were checked as the command line was read; the message is read (and checked) before
    seconds of model loading.
    """
    request.validate()
    _require_stdin(prompt)
    display = Display(_output_mode(json_output), provenance=provenance)
    message = one_message(prompt, display) if prompt is not None else None
    if system is not None:
        system, _ = as_text(system)
    with open_pair(request) as pair:
        session = ChatSession(
            pair.target, pair.draft, display,
            sampling=sampling, spec=pair.resolved.spec, k=pair.resolved.k if k is None else k,
            seed=seed, max_tokens=max_tokens, system=system, one_shot=message is not None,
        )
        resolved = pair.resolved
        drafting = f"draft {resolved.draft_name}" if resolved.draft_name else "no draft model"
        session.announce(
            f"target {resolved.target_name} · {drafting} · spec {resolved.spec} · k={session.generator.policy.name}"
        )
        if message is not None:
            session.send(message)
            if session.finish_reason == "interrupted":  # printed, but a script must not take it for a whole reply
                raise KeyboardInterrupt
        elif sys.stdin.isatty():
            session.run(typed_lines(display))
        else:
            failed = session.run(piped_lines(display), stopping_ends=True)
            if session.finish_reason == "interrupted":  # a script must not take the replies for all it sent
                raise KeyboardInterrupt
            if failed:  # a script feeding chat must see that lines failed
                raise SpeccliError(f"{failed} piped line{'s' if failed > 1 else ''} failed (each said why above)")


def _require_stdin(prompt: str | None) -> None:
    """Python's stdin where the shell closed it (`<&-`) is None: refused before any model loads, where
    the messages were to come from it."""
    if sys.stdin is not None or (prompt is not None and prompt != "-"):
        return
    if prompt == "-":
        raise UsageError("stdin is closed, so there is no message to read (--prompt -); give it with --prompt TEXT")
    raise UsageError("stdin is closed, so there are no messages to read; give one with --prompt, or pipe them in")


def _output_mode(json_output: bool) -> Mode:
    from rich.console import Console

    if json_output:
        return "json"
    return "terminal" if Console().is_terminal else "plain"
