"""A chat session: turns formatted with the target's own chat template, one Generator kept across
turns (which reuses the KV caches: see `speccli.chat.conversation`), and the slash commands between.

Context policy. Before a turn, the prompt must leave room for a reply of min(max_tokens, ctx/4)
tokens. If it does not, the oldest turns (a user message and its reply) are dropped, oldest first,
the system prompt always kept, and the shortened transcript is tokenized whole and prefilled again
(the prefix changed, so no cache can be reused past the system prompt). A message that does not fit
even alone is refused with one line. A reply that fills the context stops with a notice; the next
turn then drops old turns as above.
"""
from __future__ import annotations

from contextlib import closing
from dataclasses import replace
from typing import Iterator

from speccli.chat.conversation import Conversation, Prompt
from speccli.chat.template import chat_format_for
from speccli.chat.view import Display
from speccli.core.constraint import Grammar, GrammarSpec
from speccli.core.generator import GenerationLimits, Generator, PairCosts
from speccli.core.sampling import SamplingParams
from speccli.core.seam import ReplyDrafting
from speccli.core.stats import DoneEvent, RunStats, Source, StepEvent, TokenEvent
from speccli.core.text import begins_a_stop
from speccli.drafting.policy import PROFILED_SIZES
from speccli.drafting.specs import make_drafter, make_policy
from speccli.drafting.suffix import SuffixStore
from speccli.remembered.learnt import LearntFile
from speccli.errors import SpeccliError
from speccli.llama.model import Model, naming_non_finite_logits, shared_context
from speccli.util.interrupts import ctrl_c_as_flag, terminated
from speccli.util.sequences import common_prefix_length
from speccli.validation import AUTO_K, K, MAX_K, check_max_tokens, check_temperature, parse_k

COMMANDS = {
    "/stats": "statistics for the whole session so far",
    "/reset": "forget the conversation (the system prompt stays)",
    "/forget": "forget the conversation and the earlier replies drafts come from (--remember's file too)",
    "/k N|auto": f"draft tokens per step: 1 to {MAX_K}, or auto (chosen per step from measured costs)",
    "/temp X": "sampling temperature; 0 is greedy",
    "/system TEXT": "set the system prompt (shows it without TEXT; /system clear removes it)",
    "/provenance": "toggle coloring tokens by origin",
    "/help": "this list (a message beginning with / is sent as //...)",
    "/quit": "leave with a summary (also Ctrl-D, or Ctrl-C at the prompt)",
}


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
        store: SuffixStore | None = None,
        grammar: GrammarSpec | None = None,
    ) -> None:
        check_max_tokens(max_tokens, "max tokens")
        # Every reply follows it (--json-schema, --grammar): read for this vocabulary once, in seconds.
        self.grammar = None if grammar is None else Grammar(grammar, target.tokenizer.grammar_vocabulary(), target.n_vocab)
        self.one_shot = one_shot  # `--prompt`: one reply, then the process ends (no next turn to speak of)
        self.spec = spec
        self.draft = draft
        # Earlier replies, for a `suffix` source: this session's regenerations and turns, or remembered ones.
        self.store = SuffixStore() if store is None else store
        drafter = make_drafter(spec, draft, target, self.store)
        self.costs = PairCosts(target, drafter)
        self.generator = Generator(target, drafter, sampling, make_policy(k), seed, self.costs)
        # What `auto` learnt about this pair in earlier sessions: a first reply drafts as the last ended.
        self.learnt = LearntFile(target, draft, display.warning)
        self.learnt.recall(self.generator.policy, sampling, self.costs)
        self.display = display
        self.max_tokens = max_tokens
        chat_format, self.fallback_reason = chat_format_for(target.tokenizer)
        self.conversation = Conversation(target.tokenizer, chat_format, system)
        self.n_ctx = shared_context(target, draft)
        if system:  # once, naming it, not again at every message
            self._require_fits(self.conversation, "--system")
        self._profile(PROFILED_SIZES if k == AUTO_K else ())
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
                    if text.startswith("/") and not text.startswith("//"):
                        if not self.command(text):
                            break
                    else:
                        self.send(text.removeprefix("/"))  # "//": a message that begins with one "/"
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
        limits = GenerationLimits(self.max_tokens, self.conversation.format.stop, self.grammar)
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
            self.display.notice(f"(reply cut at {self.max_tokens} token{'s' if self.max_tokens > 1 else ''}: --max-tokens)")
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
        self.store.persist()
        self.learnt.keep(self.generator.policy, self.generator.sampling, costs=self.costs)
        if self.grammar is not None and reason in ("max_tokens", "context"):
            # Shown and kept as any cut reply, but a script must not take it for a whole one.
            raise SpeccliError(f"the reply was cut before it was complete: it does not follow {self.grammar.spec.name} "
                               "as a whole (raise --max-tokens)")
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

    def _require_fits(self, conversation: Conversation, name: str) -> None:
        """A system prompt that leaves no room for any message and reply, refused as given."""
        needed = len(conversation.prompt_alone("").tokens)
        if needed >= self.n_ctx:
            raise SpeccliError(f"{name}: the system prompt takes {needed} tokens as the chat format frames it, and "
                               f"the context holds {self.n_ctx}; shorten it or raise --ctx")

    def _refuse_if_too_long(self, prompt: Prompt) -> None:
        if len(prompt.tokens) >= self.n_ctx:
            alongside = "with the system prompt" if self.conversation.system else "as the chat format frames it"
            raise SpeccliError(
                f"this message needs {len(prompt.tokens)} tokens {alongside}, and its reply one more, but "
                f"the context holds {self.n_ctx}; shorten it or raise --ctx"
            )

    def _profile(self, sizes: tuple[int, ...]) -> None:
        """Time the pair's one cost profile at the caches' end: what a token costs the target alone, against
        which chat estimates speculation's speedup (`stats_view.estimated_speedup`), and, with `sizes`, the
        verify costs `auto` drafts by (a fixed K needs neither them nor their second). As a session starts
        it is timed at position 0, slightly below what a decode costs deep in a long context."""
        generator = self.generator
        context = generator.tokens or [max(generator.target.tokenizer.bos_id, 0)]
        with naming_non_finite_logits(generator.target, self.draft):  # it samples from the target's logits
            self.target_token_seconds = self.costs.profile(context, sizes, generator.sampling).target_token_seconds

    def command(self, line: str) -> bool:
        """Run one slash command; False means leave."""
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        if argument and (name in COMMANDS or name == "/exit"):  # a usage without a space takes no argument
            raise SpeccliError(f"{name} takes no argument, got {argument!r}")
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
        elif name == "/forget":
            self.conversation.clear()
            self.generator.reset()
            self.generator.drafter.forget_all()
            self.store.clear()  # a source-less chat has no drafter that holds it
            self.store.persist(now=True)
            self.display.notice("(conversation and earlier replies forgotten)")
        elif name == "/k":
            self.generator.policy = make_policy(parse_k(argument, "/k"))
            self.learnt.recall(self.generator.policy, self.generator.sampling, self.costs)
            if self.generator.policy.needs_costs:  # timed again only for sizes not yet timed
                self._profile(PROFILED_SIZES)
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
                self._require_fits(Conversation(self.conversation.tokenizer, self.conversation.format, argument), "/system")
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
            spaced = " (a command has no space after its /)" if name == "/" else ""
            raise SpeccliError(f"unknown command {name}{spaced}; known: {known}")
        return True


def _oldest_turns(count: int) -> str:
    return "oldest turn" if count == 1 else f"{count} oldest turns"


def _parse_float(command: str, argument: str) -> float:
    try:
        return float(argument)
    except ValueError:
        got = f"got {argument!r}" if argument else "and none was given"
        raise SpeccliError(f"{command} needs a number, {got}") from None

