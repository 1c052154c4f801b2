"""`speccli chat` on tiny real GGUF pairs: one-shot, piped turns, slash commands, KV reuse across turns,
the context policy, provenance styling, bad input, and once a real terminal (tmux) for Live and Ctrl-C.

Tiny random models emit byte soup, so tests check structure (records, counts, styles), never wording.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import TokenType
from typer.testing import CliRunner

from speccli.llama.model import LoadOptions, Model
from speccli.chat.conversation import Conversation
from speccli.chat.session import ChatSession, no_pay_notice
from speccli.chat.template import TemplateFormat, chat_format_for
from speccli.cli.app import app
from speccli.chat.stats_view import acceptance_bar, estimated_speedup, stats_panel, stats_record, summary_line
from speccli.chat.view import Display, LiveReply
from speccli.core.generator import measure_costs
from speccli.core.stats import RunStats, Source, StepEvent
from speccli.core.sampling import SamplingParams
from speccli.core.seam import CostProfile, DraftCosts, ReplyDrafting
from tests.tiny_gguf import TinyConfig, gpt2_vocabulary, spm_vocabulary, write_related_pair, write_tiny_gguf

REPO = Path(__file__).resolve().parents[1]
# Renders "<s><user>hi</s><assistant>": BOS and EOS by text, as real templates do.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
NO_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('system messages are not supported') }}{% endif %}"
    + CHAT_TEMPLATE
)


def _templated_pair(directory: Path, template: str, name: str) -> tuple[Path, Path]:
    vocab = replace(spm_vocabulary(512), chat_template=template)
    return write_related_pair(directory, target_layers=4, draft_layers=2, config=TinyConfig(vocab=vocab), name=name)


@pytest.fixture(scope="module")
def chat_pair(tiny_dir: Path) -> tuple[Path, Path]:
    return _templated_pair(tiny_dir / "chat", CHAT_TEMPLATE, "chat")


@pytest.fixture(scope="module")
def no_system_pair(tiny_dir: Path) -> tuple[Path, Path]:
    return _templated_pair(tiny_dir / "nosystem", NO_SYSTEM_TEMPLATE, "nosystem")


@pytest.fixture(scope="module")
def endless_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """All logits equal, so greedy always picks token 0, made the ordinary piece "la ": a reply that
    never ends by itself (no end-of-generation token wins), to have something to interrupt."""
    vocab = spm_vocabulary(512)
    vocab = replace(
        vocab, tokens=("la\u2581",) + vocab.tokens[1:], token_types=(int(TokenType.NORMAL),) + vocab.token_types[1:],
        unk_id=None,
    )
    return write_related_pair(tiny_dir / "endless", target_layers=2, draft_layers=1,
                              config=TinyConfig(head_scale=0.0, vocab=vocab, context_length=32768), name="endless")


def chat(pair, *args: str, input: str | None = None, terminal: bool = False):
    """Run `speccli chat` on a pair; output is a pipe unless `terminal` (rich honours TTY_COMPATIBLE)."""
    env = {"TTY_COMPATIBLE": "1" if terminal else "0", "FORCE_COLOR": None, "NO_COLOR": None, "COLUMNS": "100"}
    target, draft = pair
    return CliRunner(env=env).invoke(
        app, ["chat", "-m", str(target), "-md", str(draft), "-t", "1", "-c", "512", *args], input=input,
        catch_exceptions=False,
    )


def records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


# --- one-shot and pipes -------------------------------------------------------------------------


def test_one_shot_to_a_pipe_is_plain_text_with_stats_on_stderr(tiny_pair):
    result = chat(tiny_pair, "-p", "hello", "-n", "12", "--seed", "1")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.endswith("\n") and len(result.stdout) > 1
    assert "\x1b[" not in result.stdout and "\x1b[" not in result.stderr
    assert "no chat template" in result.stderr  # the fallback is said, once
    assert result.stderr.count("no chat template") == 1
    assert "tok/s" in result.stderr and "acceptance" in result.stderr


def test_a_reply_cut_while_it_writes_the_end_of_turn_marker_leaves_the_marker_out(tiny_dir):
    """Without a chat template a reply ends at the next "\nUser:". A pair whose every token is "\nUser"
    (all logits equal, greedy takes token 0) cut at 2 tokens had given "\nUser\nUser": the second was
    held back as the marker's beginning, and then printed when the token limit came first."""
    vocab = spm_vocabulary(512)
    vocab = replace(vocab, tokens=("\nUser",) + vocab.tokens[1:], token_types=(int(TokenType.NORMAL),) + vocab.token_types[1:],
                    unk_id=None)
    pair = write_related_pair(tiny_dir / "marker", target_layers=2, draft_layers=1,
                              config=TinyConfig(head_scale=0.0, vocab=vocab), name="marker")
    result = chat(pair, "-p", "hello", "-n", "2", "--temp", "0", "--json")
    [record] = records(result.stdout)
    assert (record["reply"], record["finish_reason"], record["stats"]["generated_tokens"]) == ("\nUser", "max_tokens", 2)


def test_a_one_shot_reply_cut_before_its_schema_ends_is_a_failure(tiny_pair, tmp_path):
    """Printed as any cut reply, but exit 1: a script must not take half a JSON object for the reply."""
    cut_schema, short_schema = tmp_path / "object.json", tmp_path / "enum.json"
    cut_schema.write_text(json.dumps({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}))
    short_schema.write_text(json.dumps({"enum": ["yes", "no"]}))
    cut = chat(tiny_pair, "-p", "hello", "--json-schema", str(cut_schema), "-n", "3", "--seed", "1")
    assert cut.exit_code == 1 and cut.stdout.startswith("{"), cut.stderr
    assert cut.stderr.strip().splitlines()[-1] == (
        f"error: the reply was cut before it was complete: it does not follow --json-schema {cut_schema} as a whole "
        "(raise --max-tokens)")
    whole = chat(tiny_pair, "-p", "hello", "--json-schema", str(short_schema), "-n", "8", "--seed", "1")
    assert whole.exit_code == 0 and json.loads(whole.stdout) in ("yes", "no"), whole.stderr


def test_one_shot_json_record(tiny_pair):
    result = chat(tiny_pair, "-p", "hello", "-n", "12", "--seed", "1", "--k", "3", "--json")
    assert result.exit_code == 0, result.stderr
    [record] = records(result.stdout)
    assert record["prompt"] == "hello"
    assert record["finish_reason"] in {"eog", "max_tokens", "stop"}
    stats = record["stats"]
    assert max(map(int, stats["draft_lengths"])) == 3 and len(stats["acceptance_by_position"]) == 3
    assert 0 < stats["generated_tokens"] <= 12
    assert stats["estimated_speedup"] > 0


def test_prompt_dash_reads_all_of_stdin_as_one_message(tiny_pair):
    """The newline that ends its last line, as `echo ... |` writes it, is not part of the message (one
    only: the blank line before it is)."""
    result = chat(tiny_pair, "-p", "-", "-n", "4", "--json", input="first line\nsecond line\n\n")
    assert [r["prompt"] for r in records(result.stdout)] == ["first line\nsecond line\n"]
    result = chat(tiny_pair, "-p", "-", "-n", "4", "--json", input="Tell me a joke\r\n")
    assert [r["prompt"] for r in records(result.stdout)] == ["Tell me a joke"]


def test_piped_lines_are_turns_with_the_models_chat_template(chat_pair):
    result = chat(chat_pair, "-n", "16", "--temp", "0", "--json", input="hello there\nhow are you\nbye\n")
    assert result.exit_code == 0, result.stderr
    assert "no chat template" not in result.stderr
    *replies, session = records(result.stdout)
    assert [r["prompt"] for r in replies] == ["hello there", "how are you", "bye"]
    assert session["session"]["generated_tokens"] == sum(r["stats"]["generated_tokens"] for r in replies)
    for after in replies[1:]:
        # The KV cache keeps the conversation as far as its re-rendered text tokenizes alike: this tiny
        # model's replies hold bytes that are not UTF-8, which do not, so the bound is only that some of
        # it was kept (greedy, so that the replies do not move with the timed draft lengths).
        assert 0 < after["prefill_tokens"] < after["stats"]["prompt_tokens"]



@pytest.mark.parametrize("piped", ["", "\n  \n\t\n"])
def test_piped_input_with_no_message_is_refused_before_the_models_load(chat_pair, piped):
    """It had loaded both models, then ended with nothing done; the control: one line after blank ones is a turn."""
    result = chat(chat_pair, "-n", "2", input=piped)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == "error: no message was piped in (stdin ended before a line that is not blank)\n"
    result = chat(chat_pair, "-n", "2", "--json", input=piped + "hello\n")
    assert result.exit_code == 0 and [r["prompt"] for r in records(result.stdout)[:-1]] == ["hello"]

# --- conversation and KV reuse, through the Python API ----------------------------------------------


def test_template_rendering_has_one_bos_and_eos_by_text(chat_pair):
    with Model(chat_pair[0], LoadOptions(n_ctx=512, n_threads=1)) as target:
        chat_format, fallback_reason = chat_format_for(target.tokenizer)
        assert isinstance(chat_format, TemplateFormat) and fallback_reason is None
        prompt = Conversation(target.tokenizer, chat_format, "be brief").prompt_for("hi")
        assert prompt.text == "<s><system>be brief</s><user>hi</s><assistant>"
        tokenizer = target.tokenizer
        assert prompt.tokens[0] == tokenizer.bos_id and tokenizer.bos_id not in prompt.tokens[1:]
        assert prompt.tokens.count(2) == 2  # "</s>" parsed as the EOS token, not as text


def test_second_turn_decodes_only_new_tokens(chat_pair):
    options = LoadOptions(n_ctx=512, n_threads=1)
    with Model(chat_pair[0], options) as target, Model(chat_pair[1], options) as draft:
        display = Display("plain", provenance=False, out=io.StringIO(), err=io.StringIO())
        session = ChatSession(target, draft, display, sampling=SamplingParams(temperature=0), spec="model", k=3, max_tokens=40)
        session.send("tell me something long " * 6)
        first_turn_tokens = len(session.conversation._fed_tokens)
        decoded_before = target.decoded_tokens, draft.decoded_tokens
        session.max_tokens = 1
        session.send("and again")
        new_tokens = len(session.conversation._fed_tokens) - first_turn_tokens  # the new message and 1 reply token
        target_decoded = target.decoded_tokens - decoded_before[0]
        draft_decoded = draft.decoded_tokens - decoded_before[1]
        # Prefill of the new text, then one step of at most k+1 tokens; never the first turn again.
        assert target_decoded <= new_tokens + 3 + 1
        assert draft_decoded <= new_tokens + 3 + 1
        assert target_decoded < first_turn_tokens


def test_ctrl_c_during_a_long_prompts_prefill_stops_it_and_keeps_no_turn(chat_pair):
    """The prefill is decoded a batch at a time and Ctrl-C is heeded between batches (it had waited for
    all of them); a message stopped before its reply began is not kept, nor counted as a reply, so sent
    again it is there once. Its record counts the prompt tokens decoded before the stop."""
    options = LoadOptions(n_ctx=512, n_threads=1, n_batch=32)
    with Model(chat_pair[0], options) as target, Model(chat_pair[1], options) as draft:
        out, err = io.StringIO(), io.StringIO()
        display = Display("json", provenance=False, out=out, err=err)
        session = ChatSession(target, draft, display, sampling=SamplingParams(temperature=0), spec="model", k=3, max_tokens=4)
        real_decode, decodes = target.decode, []

        def ctrl_c_in_the_first_batch(tokens, n_logit_rows=1):
            decodes.append(len(tokens))
            if len(decodes) == 1:
                os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it: chat only sets its flag
            return real_decode(tokens, n_logit_rows)

        target.decode = ctrl_c_in_the_first_batch
        message = "tell me something long " * 12
        assert session.send(message) == ""
        assert decodes == [32] and session.finish_reason == "interrupted"
        assert session.conversation.turns == [] and session.replies == 0
        stopped = json.loads(out.getvalue().splitlines()[-1])
        assert (stopped["finish_reason"], stopped["prefill_tokens"]) == ("interrupted", 32)
        prompt_tokens = len(session.conversation.prompt_for(message).tokens)
        decoded_before = target.decoded_tokens
        session.send(message)  # sent again: the prefill goes on from the batch already decoded
        reply = session.generator.reply_stats
        assert target.decoded_tokens - decoded_before == (prompt_tokens - 1 - 32) + reply.steps + reply.drafted_counted
        assert json.loads(out.getvalue().splitlines()[-1])["prefill_tokens"] == prompt_tokens - 1 - 32
    assert [turn["content"] for turn, _ in session.conversation.turns] == [message] and session.replies == 1


def _session_with_ctrl_c_at(chat_pair, decode_with_rows):
    """A chat session whose target decode with `decode_with_rows` rows (0: the prefill's, more: a
    verify) sends Ctrl-C the first time, as the terminal would: chat only sets its flag."""
    options = LoadOptions(n_ctx=512, n_threads=1)
    target, draft = Model(chat_pair[0], options), Model(chat_pair[1], options)
    err = io.StringIO()
    display = Display("plain", provenance=False, out=io.StringIO(), err=err)
    session = ChatSession(target, draft, display, sampling=SamplingParams(temperature=0), spec="model", k=3, max_tokens=8)
    real_decode, sent = target.decode, []

    def ctrl_c_once(tokens, n_logit_rows=1):
        if (n_logit_rows > 0) == (decode_with_rows > 0) and not sent:
            sent.append(len(tokens))
            os.kill(os.getpid(), signal.SIGINT)
        return real_decode(tokens, n_logit_rows)

    target.decode = ctrl_c_once
    return session, err, (target, draft)


def test_ctrl_c_in_a_short_prompts_prefill_keeps_no_turn_and_verifies_nothing(chat_pair):
    """A prompt of one batch: the Ctrl-C lands in its only prefill decode. The reply has not begun, so
    no step is verified and the message is not kept (had it been, sent again it would be there twice)."""
    session, err, models = _session_with_ctrl_c_at(chat_pair, decode_with_rows=0)
    with models[0], models[1]:
        assert session.send("hi") == ""
        assert session.finish_reason == "interrupted" and session.generator.reply_stats.steps == 0
        assert "(stopped; the message is not kept)" in err.getvalue()
        assert session.conversation.turns == [] and session.replies == 0
        session.send("hi")
    assert [turn["content"] for turn, _ in session.conversation.turns] == ["hi"] and session.replies == 1


def test_ctrl_c_during_a_verify_gives_that_steps_tokens_and_stops_before_the_next(chat_pair):
    """The step under way when Ctrl-C comes is verified: its tokens are shown and kept, and its figures
    count them (they had been counted unshown: '0 tokens · acceptance 29%'); no step follows it."""
    session, err, models = _session_with_ctrl_c_at(chat_pair, decode_with_rows=1)
    with models[0], models[1]:
        reply = session.send("hi")
        stats = session.generator.reply_stats
        assert session.finish_reason == "interrupted" and stats.steps == 1
        assert reply and stats.generated == stats.accepted + 1  # its kept drafts and the target's own token
        assert "(stopped; the partial reply stays in the conversation)" in err.getvalue()
    [(message, answer)] = session.conversation.turns
    assert (message["content"], answer["content"], session.replies) == ("hi", reply, 1)


def test_chat_says_once_where_auto_found_no_draft_worth_making(chat_pair):
    """The issue's Qwen pair on this CPU: a draft model that cannot pay. Costs are set so that no draft
    could pay even if every token were kept (a drafted token costs a plain step; each verified row
    another), so `auto` neither drafts nor re-checks, whatever the tiny models' speed."""
    options = LoadOptions(n_ctx=512, n_threads=1)
    with Model(chat_pair[0], options) as target, Model(chat_pair[1], options) as draft:
        err = io.StringIO()
        display = Display("plain", provenance=False, out=io.StringIO(), err=err)
        session = ChatSession(target, draft, display, sampling=SamplingParams(temperature=0), spec="model", k="auto",
                              max_tokens=12)
        session.generator.policy.calibrate(CostProfile({n: 0.01 * n for n in (1, 2, 4, 8, 16, 25)}, {"model": DraftCosts(0.01, {})}))
        session.send("hello there")
        session.send("and again")
    notice = ("(k auto drafted nothing: by the costs measured on this machine and the acceptance seen so far, no "
              "draft would pay here, so the reply came from the target alone, at its own speed)")
    assert session.totals.drafted_counted == 0 and err.getvalue().count(notice) == 1  # said once, not every reply


def test_a_reply_with_only_re_checks_is_told_apart_from_one_without_drafts() -> None:
    assert no_pay_notice(ReplyDrafting(chosen=0, rechecks=1)) == (
        "(k auto drafted only to re-check a source it had ruled out, in 1 step: by the costs measured on this "
        "machine and the acceptance seen so far, no draft would pay here, so the rest of the reply came from the "
        "target alone, at its own speed)"
    )
    assert "in 2 steps:" in no_pay_notice(ReplyDrafting(chosen=0, rechecks=2))


# --- slash commands ---------------------------------------------------------------------------------


def test_every_slash_command(tiny_pair):
    lines = ["/help", "/k 2", "/temp 0", "/system be brief", "/system", "hello", "/provenance", "/stats",
             "/reset", "again", "/quit", "never answered"]
    result = chat(tiny_pair, "-n", "8", "--json", input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    out = records(result.stdout)
    replies = [r for r in out if "prompt" in r]
    assert [r["prompt"] for r in replies] == ["hello", "again"]
    assert all(r["k"] == "2" for r in replies)
    assert sum("session" in r for r in out) == 2  # /stats, then the summary on /quit
    for expected in ["/k N|auto", "/quit", "(k = 2)", "greedy", "system prompt: be brief", "provenance colors off",
                     "conversation cleared"]:
        assert expected in result.stderr
    # After /reset nothing is reused: the whole prompt is prefilled.
    assert replies[1]["prefill_tokens"] == replies[1]["stats"]["prompt_tokens"] - 1


def test_a_system_prompt_can_be_removed(tiny_pair):
    lines = ["hi", "/reset", "/system be brief", "hi", "/reset", "/system clear", "/system", "hi"]
    result = chat(tiny_pair, "-n", "2", "--json", input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.stderr
    alone, with_system, after = [r["stats"]["prompt_tokens"] for r in records(result.stdout) if "prompt" in r]
    assert alone == after < with_system
    assert "(system prompt removed; the next turn re-reads the conversation)" in result.stderr
    assert "(system prompt: none)" in result.stderr


def test_a_message_beginning_with_a_slash_is_sent_with_it_doubled(tiny_pair):
    result = chat(tiny_pair, "-n", "2", "--json", input="//etc/hosts is a file\n/stats\n")
    assert result.exit_code == 0, result.stderr
    assert [r["prompt"] for r in records(result.stdout) if "prompt" in r] == ["/etc/hosts is a file"]


def test_bad_slash_commands_are_one_line_each_and_the_session_goes_on(tiny_pair):
    lines = ["/bogus", "/k 0", "/k 65", "/k x", "/temp -1", "/temp hot", "/temp", "hello", "/quit now", "/reset all", "/ help", "again"]
    result = chat(tiny_pair, "-n", "4", "--json", input="\n".join(lines) + "\n")
    assert result.exit_code == 1  # piped: a script must see that lines failed
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 11 and errors[-1] == "error: 10 piped lines failed (each said why above)"
    assert result.stderr.endswith(errors[-1] + "\n")
    assert "unknown command /bogus; known: /stats, /reset, /forget, /k, /temp, /system, /provenance, /help, /quit" in errors[0]
    assert errors[1:4] == [
        "error: /k (draft tokens per step) must be between 1 and 64, got 0",
        "error: /k (draft tokens per step) must be between 1 and 64, got 65",
        "error: /k needs 'auto' or a whole number from 1 to 64, got 'x'",
    ]
    assert errors[4:7] == ["error: /temp must be from 0 (greedy) to 2, got -1.0", "error: /temp needs a number, got 'hot'",
                           "error: /temp needs a number, and none was given"]
    # Words after a command that takes none: it had acted (quit, forgot) as if they were not there.
    assert errors[7:9] == ["error: /quit takes no argument, got 'now'", "error: /reset takes no argument, got 'all'"]
    assert errors[9].startswith("error: unknown command / (a command has no space after its /); known: /stats")
    replies = [r for r in records(result.stdout) if "prompt" in r]
    assert [r["prompt"] for r in replies] == ["hello", "again"]
    assert replies[1]["prefill_tokens"] < replies[1]["stats"]["prompt_tokens"] - 1  # not reset: the cache reused


# --- bad input at start -----------------------------------------------------------------------------


def test_a_draft_of_another_vocabulary_drafts_translated_text_and_says_so(tiny_dir, tiny_pair):
    # The two test vocabularies spell 49.5% of the draft's tokens alike, under half: it drafts text (the
    # other mode is named where more are shared: tests/test_translated.py).
    other_draft = write_tiny_gguf(tiny_dir / "gpt2 draft.gguf", TinyConfig(vocab=gpt2_vocabulary(512)))
    result = chat((tiny_pair.target, other_draft), "-p", "hello")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[0] == (
        f"note: draft {other_draft} does not share target {tiny_pair.target}'s vocabulary (tokenizer model differs: "
        "draft 'gpt2', target 'llama'): it drafts text, which the target re-tokenizes (docs/drafting.md)")


def test_a_target_given_alone_with_its_pairs_draft_of_another_vocabulary_names_both(tiny_dir, tiny_pair, tmp_path):
    # `-m` alone replaces the default pair's target and keeps its draft: the line names both as the user
    # knows them (registry names, not cached files).
    other_target = write_tiny_gguf(tiny_dir / "gpt2-target.gguf", TinyConfig(vocab=gpt2_vocabulary(512)))
    config = tmp_path / "models.toml"
    config.write_text(
        f'default_pair = "tiny"\n[models.tiny-target]\npath = "{tiny_pair.target}"\n'
        f'[models.tiny-draft]\npath = "{tiny_pair.draft}"\n[models.other]\npath = "{other_target}"\n'
        '[pairs.tiny]\ntarget = "tiny-target"\ndraft = "tiny-draft"\n'
    )
    result = CliRunner().invoke(app, ["chat", "--config", str(config), "-m", "other", "-p", "hello", "-n", "4",
                                      "-t", "1", "-c", "256"])
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[0].startswith("note: draft tiny-draft does not share target other's vocabulary")


def test_a_model_that_cannot_load_is_one_line(tiny_pair, tmp_path):
    missing = tmp_path / "missing.gguf"
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    for bad in (missing, not_gguf):
        result = chat((bad, tiny_pair.draft), "-p", "hello")
        assert result.exit_code != 0
        [line] = result.stderr.splitlines()
        assert line.startswith("error: ") and str(bad) in line


def test_a_template_that_refuses_a_system_prompt(no_system_pair):
    result = chat(no_system_pair, "--system", "be brief", "-p", "hello")
    assert result.exit_code == 1
    assert "error: the chat template refused the conversation: system messages are not supported" in result.stderr


# --- context policy ---------------------------------------------------------------------------------


def test_context_overflow_drops_oldest_turns_and_refuses_what_cannot_fit(tiny_pair):
    # llama.cpp rounds n_ctx up to 256; 60-token replies fill that in a few turns.
    turns = ["one", "two", "three", "four", "five", "six", "word " * 300, "seven"]
    result = chat(tiny_pair, "-c", "256", "-n", "60", "--seed", "3", "--system", "sys", "--json",
                  input="\n".join(turns) + "\n")
    assert result.exit_code == 1, result.stderr  # the message that cannot fit failed, and the session went on
    assert "oldest turn" in result.stderr and "system prompt kept" in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and "raise --ctx" in errors[0] and errors[1] == "error: 1 piped line failed (each said why above)"
    replies = [r for r in records(result.stdout) if "prompt" in r]
    assert [r["prompt"] for r in replies] == turns[:6] + ["seven"]
    assert all(r["stats"]["prompt_tokens"] + r["stats"]["generated_tokens"] <= 256 + 1 for r in replies)


def test_a_message_that_cannot_fit_even_alone_drops_no_turn(tiny_pair):
    """Refused before any turn is dropped for it: the next message is answered with the whole history,
    exactly as in a session where the long message was never sent."""
    def session(*turns: str):
        return chat(tiny_pair, "-c", "256", "-n", "8", "--seed", "3", "--temp", "0", "--json",
                    input="\n".join(turns) + "\n")

    with_long, without = session("my name is Bob", "word " * 300, "what is my name"), session("my name is Bob", "what is my name")
    assert with_long.exit_code == 1 and without.exit_code == 0
    assert "dropped" not in with_long.stderr and "raise --ctx" in with_long.stderr
    last = [[r for r in records(result.stdout) if "prompt" in r][-1] for result in (with_long, without)]
    assert last[0]["reply"] == last[1]["reply"]
    assert last[0]["stats"]["prompt_tokens"] == last[1]["stats"]["prompt_tokens"] > 20  # both turns, re-read


# --- display ----------------------------------------------------------------------------------------


def _terminal_display(monkeypatch, provenance: bool) -> tuple[Display, io.StringIO]:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    return Display("terminal", provenance=provenance, out=out, err=out), out


def test_terminal_reply_styles_tokens_by_provenance(monkeypatch):
    display, out = _terminal_display(monkeypatch, provenance=True)
    with display.reply(target_token_seconds=None) as view:
        view.add("drafted", Source.DRAFT)
        view.add("fixed", Source.CORRECTION)
        view.add("extra\n", Source.BONUS)
    text = out.getvalue()
    assert "\x1b[32mdrafted" in text and "\x1b[1;33mfixed" in text and "\x1b[36mextra" in text


def test_terminal_reply_without_provenance_is_unstyled(monkeypatch):
    display, out = _terminal_display(monkeypatch, provenance=False)
    with display.reply(target_token_seconds=None) as view:
        view.add("drafted", Source.DRAFT)
        view.add("fixed", Source.CORRECTION)
    assert "draftedfixed" in out.getvalue()


def test_model_text_cannot_drive_the_terminal(monkeypatch):
    display, out = _terminal_display(monkeypatch, provenance=False)
    with display.reply(target_token_seconds=None) as view:
        view.add("\x1b[2Jclear", Source.DRAFT)
        view.add(" \x9b31mred\x07", Source.TARGET)  # a one-character CSI (C1), and BEL
    shown = out.getvalue()
    assert "\u241b[2Jclear" in shown and "\x1b[2J" not in shown
    assert "\ufffd31mred\u2407" in shown and "\x9b" not in shown and "\x07" not in shown


def test_cli_terminal_output_has_styles_and_legend(tiny_pair):
    result = chat(tiny_pair, "-p", "hello", "-n", "20", "--temp", "0", terminal=True)
    assert result.exit_code == 0
    assert "draft accepted" in result.stdout and "\x1b[32m" in result.stdout
    assert "target alone (no draft that step)" in result.stdout  # the tokens in the default colour, named too
    plain = chat(tiny_pair, "-p", "hello", "-n", "20", "--temp", "0", "--no-color-provenance", terminal=True)
    assert "draft accepted" not in plain.stdout


def _stats(k: int = 2) -> RunStats:
    stats = RunStats(generated=10)
    stats.add(StepEvent(drafted=k, accepted=k, draft_seconds=0.1, target_seconds=0.3, other_seconds=0.1, source="model"))
    stats.add(StepEvent(drafted=k, accepted=1, draft_seconds=0.1, target_seconds=0.3, other_seconds=0.1, source="model"))
    return stats


def test_stats_panel_is_a_pure_rendering_of_run_stats():
    console_file = io.StringIO()
    from rich.console import Console

    Console(file=console_file, width=100).print(stats_panel(_stats(), target_token_seconds=0.2, title="t"))
    text = console_file.getvalue()
    assert "75% of 4 drafted" in text and "10.0 tok/s" in text and "2.00x vs target alone" in text
    assert "██████████ 100%" in text and "█████" + " " * 5 + "  50%" in text


def test_the_panel_shows_the_hosts_time_per_row_where_the_decodes_were_timed():
    """Two steps of 0.5 s each, 0.4 s of it in llama.cpp's decode: 0.2 s of the host's own over 6 target rows."""
    stats = RunStats(generated=4)
    for accepted in (2, 1):
        stats.add(StepEvent(drafted=2, accepted=accepted, draft_seconds=0.1, target_seconds=0.3, other_seconds=0.1,
                            source="model", compute_seconds=0.4))
    text = stats_panel(stats, target_token_seconds=0.2, title="t").renderable.plain
    assert "other 0.20 s · host 33333 µs/row" in text
    assert "host" not in stats_panel(_stats(), target_token_seconds=0.2, title="t").renderable.plain  # untimed


def test_the_panel_pools_draft_positions_past_its_rows():
    """A 24-token draft shows 11 positions and one row for positions 12-24, pooled."""
    stats = _stats(k=24)  # two steps: one kept all 24, one kept 1
    text = stats_panel(stats, target_token_seconds=0.2, title="t").renderable.plain
    position_lines = [line for line in text.splitlines() if line.lstrip().startswith("draft ")]
    assert len(position_lines) == 12
    assert position_lines[0].split() == ["draft", "1", "██████████", "100%"]
    assert position_lines[1].split() == ["draft", "2", "█████", "50%"]
    assert position_lines[-1].split() == ["draft", "12-24", "█████", "50%"]  # 13 of 26 kept


def test_at_60_columns_a_long_value_wraps_under_itself_and_the_live_panel_still_fits_half_the_screen():
    """At 60 columns the time and source rows wrap: their continuations had started under the labels,
    and the wrapped lines had not been counted against the panel's height."""
    stats = RunStats(generated=40)
    for source, drafted in (("model", 24), ("ngram", 6), ("suffix", 3)):
        stats.add(StepEvent(drafted=drafted, accepted=drafted - 1, draft_seconds=0.1, target_seconds=0.3,
                            other_seconds=0.1, source=source, catch_up_seconds=0.02, compute_seconds=0.4))
    from rich.console import Console

    console = Console(file=io.StringIO(), width=60, height=24, record=True, color_system=None)
    reply = LiveReply(console, provenance=False, target_token_seconds=0.1)
    reply._stats = stats
    console.print(reply)
    panel = console.export_text().rstrip("\n").splitlines()
    assert len(panel) <= 12 and all(len(line) <= 60 for line in panel), panel
    inside = [line[2:-2] for line in panel[1:-1]]  # within the borders and their padding
    wrapped = [line for line in inside if line.startswith(" " * 14) and line.strip()]
    assert wrapped and not any(line[:14].strip() == "" and line[14] == " " for line in wrapped), inside
    assert any(line.startswith("time") for line in inside) and any("host" in line for line in inside)


def test_the_live_panel_takes_at_most_half_the_screen_so_the_reply_stays_in_view():
    """With 24 draft positions its 12 position rows made the panel 21 lines: in a 24-row terminal the
    reply streaming above it had one row left. Now it drops position rows to stay within half."""
    stats = RunStats()
    stats.add(StepEvent(drafted=24, accepted=24, draft_seconds=0.1, target_seconds=0.3, other_seconds=0.0, source="model"))
    from rich.console import Console

    for height, most in ((24, 12), (40, 20), (15, 9)):  # 9: the rows that always show, position rows gone
        console = Console(file=io.StringIO(), width=100, height=height, record=True, color_system=None)
        reply = LiveReply(console, provenance=False, target_token_seconds=0.1)
        reply._stats = stats  # the panel as the next refresh draws it
        console.print(reply)
        panel = console.export_text().rstrip("\n").splitlines()
        assert len(panel) == most and "live" in panel[0], panel


def test_speedup_estimate_and_bars():
    assert estimated_speedup(_stats(), 0.2) == pytest.approx(2.0)  # 10 tok/s against 5 tok/s alone
    assert estimated_speedup(RunStats(), 0.2) is None
    assert acceptance_bar(0.5, width=4) == "██  " and acceptance_bar(0.5, width=1) == "▌"


def test_the_speedup_estimate_never_exceeds_the_tokens_per_target_decode():
    """A step costs a target decode at least: a baseline timed slow had shown '1.00 tok/decode ·
    acceptance 0% · ~49.83x'."""
    one_per_decode = RunStats(generated=2)
    for _ in range(2):
        one_per_decode.add(StepEvent(drafted=2, accepted=0, draft_seconds=0.1, target_seconds=0.3, other_seconds=0.1,
                                     source="model"))
    assert estimated_speedup(one_per_decode, target_token_seconds=25.0) == 1.0
    assert estimated_speedup(_stats(), target_token_seconds=50.0) == pytest.approx(5.0)  # 10 tokens in 2 decodes
    assert "~1.00x vs target alone" in summary_line(one_per_decode, 25.0)
    assert summary_line(one_per_decode, 25.0).startswith("2 tokens ·")
    assert summary_line(RunStats(generated=1), None).startswith("1 token ·")  # not "1 tokens"
    assert stats_record(one_per_decode, 25.0)["estimated_speedup"] == 1.0


def test_the_baseline_token_time_shrugs_off_slow_decodes(tiny_model):
    """Two of the cost profile's three 1-row decodes slowed as a loaded machine slows them (a median would
    take one): the estimate's baseline must stay what the model costs, and the cache as it was."""
    with Model(tiny_model, LoadOptions(n_ctx=64, n_threads=1)) as model:
        sequence = model.sequence(0)  # the model's own decodes and timings are its sequence's
        decode, calls = sequence.decode, []

        def sometimes_slow(*args, **kwargs):
            calls.append(1)
            if len(calls) in (2, 3):
                time.sleep(0.5)
            return decode(*args, **kwargs)

        sequence.decode = sometimes_slow
        seconds = measure_costs(model, None, [0], (), SamplingParams()).target_token_seconds
        assert len(calls) >= 4 and model.n_past == 0
    assert seconds < 0.25


def test_session_totals_add_runs_of_different_k():
    total = _stats(k=2) + _stats(k=3)
    assert total.positions.drafted_at == [4, 4, 2] and total.positions.accepted_at == [4, 2, 1]
    assert total.generated == 20 and total.draft_lengths == {2: 2, 3: 2}
    assert total.by_source["model"].drafted == 10 and total.steps == 4


# --- interrupting a one-shot reply ------------------------------------------------------------------


@pytest.mark.parametrize(("interrupt", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_one_shot_reply_interrupted_is_printed_and_exits_as_interrupted(endless_pair, interrupt, exit_code):
    """`-p` in a script: the part of the reply made before the interrupt is written, its JSON record says
    it was interrupted, and the exit code is not 0, so the script does not take it for a whole reply."""
    target, draft = endless_pair
    command = [sys.executable, "-m", "speccli", "chat", "-m", str(target), "-md", str(draft), "-t", "1", "-c", "4096",
               "--k", "4", "--temp", "0", "-n", "1000000", "-p", "sing", "--json"]
    process = subprocess.Popen(command, cwd=REPO, env=dict(os.environ, SPECCLI_LLAMA_LOG="0"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Reading the first line of stderr (the announcement) means the models are loaded; the reply has begun.
    process.stderr.readline()
    time.sleep(0.5)
    process.send_signal(interrupt)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == exit_code, stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in stderr and b"Exception ignored" not in stderr
    if interrupt == signal.SIGINT:
        [record] = records(stdout.decode())
        assert record["finish_reason"] == "interrupted" and record["reply"].startswith("la la")
        # What the stopped reply cost, its prefill included (it had been reported as 0.0).
        assert record["stats"]["prefill_seconds"] > 0 and record["stats"]["generated_tokens"] == record["reply"].count("la")
        assert "(stopped)\n" in stderr.decode() and b"stays in the conversation" not in stderr  # no conversation goes on
    else:  # SIGTERM ends the process: the reply stops, and no record is written for it
        assert stdout == b""


def _piped_chat(pair, *options: str) -> subprocess.Popen:
    target, draft = pair
    command = [sys.executable, "-m", "speccli", "chat", "-m", str(target), "-md", str(draft), "-t", "1", "-c", "4096",
               "--k", "4", "--temp", "0", "--json", *options]
    return subprocess.Popen(command, cwd=REPO, env=dict(os.environ, SPECCLI_LLAMA_LOG="0"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _ended_with_stdin_open(process: subprocess.Popen) -> tuple[bytes, bytes]:
    """stdout and stderr once `process` has exited, its stdin open till then: `communicate` closes it at
    once, and an end of input arriving with the Ctrl-C makes the session end as well as stop."""
    try:
        process.wait(timeout=30)  # what it writes here fits the pipes' buffers
    except subprocess.TimeoutExpired:
        process.kill()  # a chat that did not end would otherwise go on generating after the test
        process.communicate()
        raise
    process.stdin.close()
    return process.stdout.read(), process.stderr.read()


def test_ctrl_c_during_a_piped_reply_ends_the_session_as_interrupted(endless_pair):
    """Piped lines have no one to type the next: the stopped reply had been followed by the next line's,
    and the command exited 0, as if every line had its whole reply."""
    process = _piped_chat(endless_pair, "-n", "1000000")
    process.stdin.write(b"sing\nsing again\n")
    process.stdin.flush()
    process.stderr.readline()  # chat's first notice: the models are loaded, and the first reply begins
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    stdout, stderr = _ended_with_stdin_open(process)
    assert process.returncode == 130, stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in stderr
    reply, session = records(stdout.decode())
    assert reply["prompt"] == "sing" and reply["finish_reason"] == "interrupted"
    # The statistics, then the end: "sing again" was never sent.
    assert session["session"]["generated_tokens"] == reply["stats"]["generated_tokens"]


def test_ctrl_c_while_a_piped_chat_waits_for_its_next_line_shows_the_session_first(endless_pair):
    process = _piped_chat(endless_pair, "-n", "4")
    process.stdin.write(b"sing\n")
    process.stdin.flush()  # and the pipe stays open: the chat waits for the next line
    reply = json.loads(process.stdout.readline())
    assert reply["finish_reason"] == "max_tokens"
    process.send_signal(signal.SIGINT)
    stdout, stderr = _ended_with_stdin_open(process)
    assert process.returncode == 130, stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in stderr
    [session] = records(stdout.decode())
    assert session["session"]["generated_tokens"] == reply["stats"]["generated_tokens"]


# --- a real terminal --------------------------------------------------------------------------------


def _wait_for(session: str, predicate, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
        if predicate(screen) or time.monotonic() > deadline:
            return screen
        time.sleep(0.2)


@contextmanager
def chat_in_tmux(pair, chat_options: str, width: int, height: int) -> Iterator[str]:
    """`speccli chat` on `pair` in a real terminal of `width` x `height` (tmux), at its prompt: the
    session's name. The shell stays after chat exits, with "EXITED <code>" on screen."""
    session = f"speccli-chat-{uuid.uuid4().hex[:8]}"
    target, draft = pair
    command = (
        # The terminal's own size: a COLUMNS or LINES in the tmux server's environment would override it.
        f"cd {REPO} && env -u COLUMNS -u LINES {sys.executable} -m speccli chat -m {target} -md {draft} -t 1 --temp 0 "
        f"{chat_options}; echo EXITED $?; sleep 30"
    )
    for attempt in range(3):
        # A new session can reach a tmux server that the previous test's last kill-session is shutting
        # down ("server exited unexpectedly", seen once in CI): a fresh server then starts on a retry.
        started = subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), command],
                                 capture_output=True, text=True)
        if started.returncode == 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"tmux could not start a session: {started.stderr.strip()}")
    try:
        _wait_for(session, lambda s: "\n> " in s or s.rstrip().endswith(">"))
        yield session
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_live_display_and_ctrl_c_in_a_real_terminal(endless_pair):
    # A fixed K: under `auto` the tiny models' timings decide whether drafting pays at all, and on a
    # busy machine it once did not for the first 258 tokens, so the panel had no acceptance to show.
    with chat_in_tmux(endless_pair, "-n 1000000 -c 32768 --k 4", width=120, height=40) as session:
        screen = _wait_for(session, lambda s: "\n> " in s or s.rstrip().endswith(">"))
        assert "draft accepted" in screen, screen
        subprocess.run(["tmux", "send-keys", "-t", session, "sing", "Enter"], check=True)
        screen = _wait_for(session, lambda s: "tok/s" in s and "la la" in s)
        assert "live" in screen and "acceptance" in screen, screen
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        screen = _wait_for(session, lambda s: "stopped" in s)
        assert "(stopped; the partial reply stays in the conversation)" in screen, screen
        subprocess.run(["tmux", "send-keys", "-t", session, "/k 3", "Enter"], check=True)
        screen = _wait_for(session, lambda s: "(k = 3)" in s)
        assert "(k = 3)" in screen, screen
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)  # at the prompt: leave
        screen = _wait_for(session, lambda s: "EXITED" in s)
        assert "EXITED 0" in screen and "session: 1 reply" in screen, screen


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_a_reply_taller_than_a_short_terminal_is_printed_once(endless_pair):
    """300 tokens of "la " fill 10 rows of a 12-row terminal. A reply that ended between two refreshes
    was left whole in the live region, taller than the screen, and what had scrolled off it could not be
    erased: its rows came out twice. The panel too must fit the screen."""
    with chat_in_tmux(endless_pair, "-n 300 -c 4096 --k 4", width=100, height=12) as session:
        subprocess.run(["tmux", "send-keys", "-t", session, "sing", "Enter"], check=True)
        _wait_for(session, lambda s: "reply cut at 300 tokens" in s)
        history = subprocess.run(["tmux", "capture-pane", "-p", "-S", "-1000", "-t", session], capture_output=True, text=True).stdout
        assert history.split().count("la") == 300, history
        assert "live" not in history, history  # the panel went with the live region


def _letters(directory: Path) -> Path:
    grammar = directory / "letters.gbnf"
    grammar.write_text("root ::= [a-z ]+\n")
    return grammar


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_a_pasted_block_of_lines_is_one_message(endless_pair, tmp_path):
    """Pasted (as a terminal marks a paste) and sent with Enter: one turn, not one per line."""
    pasted = tmp_path / "paste.txt"
    pasted.write_text("first line\nsecond line\nthird line")
    with chat_in_tmux(endless_pair, "-n 3 -c 4096 --k 4 --grammar " + str(_letters(tmp_path)), width=100, height=30) as session:
        assert "replies follow --grammar" in _wait_for(session, lambda s: "replies follow" in s)  # the header says so
        buffer = session  # tmux buffers are global: named after the session, so tests in parallel keep theirs
        subprocess.run(["tmux", "load-buffer", "-b", buffer, str(pasted)], check=True)
        subprocess.run(["tmux", "paste-buffer", "-p", "-d", "-b", buffer, "-t", session], check=True)
        screen = _wait_for(session, lambda s: "third line" in s, timeout=10)
        assert "reply cut" not in screen, screen  # nothing sent before Enter
        subprocess.run(["tmux", "send-keys", "-t", session, "Enter"], check=True)
        _wait_for(session, lambda s: "reply cut at 3 tokens" in s)
        subprocess.run(["tmux", "send-keys", "-t", session, "C-d"], check=True)
        screen = _wait_for(session, lambda s: "EXITED" in s)
        assert "EXITED 0" in screen and "session: 1 reply" in screen, screen


@pytest.mark.parametrize(
    "args, message",
    [
        (["--k", "0"], "error: --k (draft tokens per step) must be between 1 and 64, got 0"),
        (["--k", "65"], "error: --k (draft tokens per step) must be between 1 and 64, got 65"),
        (["--temp", "-0.5"], "error: --temp must be from 0 (greedy) to 2, got -0.5"),
        # serve's limit too (OpenAI's): chat had run at 100 where serve refused it.
        (["--temp", "100"], "error: --temp must be from 0 (greedy) to 2, got 100.0"),
        (["--top-p", "0"], "error: --top-p must be in (0, 1], got 0.0"),
        (["--top-p", "1.5"], "error: --top-p must be in (0, 1], got 1.5"),
        (["--top-k", "-1"], "error: --top-k must be >= 0 (0 keeps every token), got -1"),
        (["--min-p", "1"], "error: --min-p must be in [0, 1), got 1.0"),
        (["-n", "0"], "error: --max-tokens must be >= 1, got 0"),
        (["-p", "   "], "error: the prompt (--prompt) is empty"),
    ],
)
def test_bad_settings_are_one_line_naming_the_parameter_and_range(tiny_pair, args, message):
    result = chat(tiny_pair, "-p", "hello", *args)
    assert result.exit_code == 1
    assert result.stderr == message + "\n"
    assert result.stdout == ""


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_a_message_longer_than_the_context_is_one_line_naming_what_it_counted(chat_pair, system):
    result = chat(chat_pair, "-p", "word " * 600, *(["--system", system] if system else []))
    alongside = "with the system prompt" if system else "as the chat format frames it"
    assert result.exit_code == 1 and result.stdout == ""
    assert re.fullmatch(rf"error: this message needs \d+ tokens {alongside}, and its reply one more, but the context holds 512; "
                        r"shorten it or raise --ctx\n", result.stderr), result.stderr


def test_a_system_prompt_longer_than_the_context_is_refused_once_naming_it(chat_pair):
    """Piped, it had been blamed on every message in turn ("this message needs 409 tokens with the system
    prompt"), each line a failure; `/system` keeps the prompt it had (the control: a short one is taken)."""
    long = "word " * 600
    result = chat(chat_pair, "--system", long, input="hi\nthere\n")
    assert result.exit_code == 1 and result.stdout == ""
    assert re.fullmatch(r"error: --system: the system prompt takes \d+ tokens as the chat format frames it, and the "
                        r"context holds 512; shorten it or raise --ctx\n", result.stderr), result.stderr
    result = chat(chat_pair, input=f"/system {long}\n/system\n/system Be brief.\n/system\n")
    assert "error: /system: the system prompt takes" in result.stderr
    assert "(system prompt: none)" in result.stderr and "(system prompt: Be brief.)" in result.stderr


def test_a_k_that_is_not_a_number_is_a_usage_error_as_a_temperature_that_is_not_is(tiny_pair):
    result = chat(tiny_pair, "-p", "hello", "--k", "two")
    assert (result.exit_code, result.stderr) == (2, "error: --k needs 'auto' or a whole number from 1 to 64, got 'two'\n")
    assert chat(tiny_pair, "-p", "hello", "--temp", "abc").exit_code == 2


@pytest.mark.parametrize(
    "args, message",
    [(["-c", "0"], "error: --ctx must be at least 16 tokens, got 0"), (["-t", "0"], "error: --threads must be >= 1, got 0"),
     (["-t", "100000"], "error: --threads must be at most 512 (ggml's limit), got 100000")],
)
def test_context_and_threads_are_checked_before_loading(tiny_pair, args, message):
    result = chat(tiny_pair, "-p", "hello", *args)
    assert result.exit_code == 1
    assert result.stderr == message + "\n"


# --- draft sources and K ------------------------------------------------------------------------------


def test_ngram_spec_loads_no_draft_model_and_reports_its_source(tiny_pair):
    target, _ = tiny_pair
    text = "one two three four five six seven eight nine ten " * 4
    result = CliRunner(env={"COLUMNS": "100"}).invoke(
        app, ["chat", "-m", str(target), "--spec", "ngram", "--k", "8", "-t", "1", "-c", "512", "--temp", "0",
              "-n", "30", "--json", "-p", text],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    [record] = records(result.stdout)
    assert (record["spec"], record["k"]) == ("ngram", "8")
    assert set(record["stats"]["by_source"]) <= {"ngram"}  # no model was there to draft


def test_a_draft_model_with_a_draft_free_source_is_refused_before_loading(tiny_pair):
    result = chat(tiny_pair, "--spec", "ngram", "-p", "hello")
    assert result.exit_code == 2  # options that cannot go together, as --ngl-draft with it
    assert result.stderr.startswith("error: --spec ngram drafts without a model, but a draft model was given (")
    assert result.stderr.count("\n") == 1
    bad = chat(tiny_pair, "--spec", "tree", "-p", "hello")
    assert (bad.exit_code, bad.stderr) == (1, "error: --spec must be one of ngram, suffix, model, ngram+model, suffix+model, got 'tree'\n")


def test_k_auto_and_the_panel_shows_the_k_chosen_and_each_source(tiny_pair):
    result = chat(tiny_pair, "--spec", "ngram+model", "--k", "auto", "-n", "16", "--temp", "0", "--json",
                  input="/k 3\nhello there\n/k auto\nhello there\n")
    assert result.exit_code == 0, result.stderr
    replies = [r for r in records(result.stdout) if "prompt" in r]
    assert [r["k"] for r in replies] == ["3", "auto"]
    assert max(map(int, replies[0]["stats"]["draft_lengths"])) == 3
    stats = RunStats(generated=12)
    stats.add(StepEvent(4, 4, 0.01, 0.02, 0.0, "ngram"))
    stats.add(StepEvent(0, 0, 0.0, 0.02, 0.0, None))
    stats.add(StepEvent(2, 1, 0.02, 0.02, 0.0, "model"))
    console_file = io.StringIO()
    from rich.console import Console

    Console(file=console_file, width=100).print(stats_panel(stats, target_token_seconds=0.02, title="t"))
    text = console_file.getvalue()
    assert "model 50% of 2 · ngram 100% of 4" in text and "mean 2.0 · 0×1 2×1 4×1" in text
    assert "catch-up" not in text and "take-overs" not in text  # neither happened
    stats.add(StepEvent(5, 5, 0.03, 0.02, 0.0, "model", catch_up_seconds=0.01, continuation=("ngram", 3)))
    record = stats_record(stats, 0.02)
    assert record["take_overs"] == {"ngram": 1} and record["catch_up_seconds"] == 0.01
    assert record["acceptance_rate"] == round(10 / 11, 4) and record["by_source"]["ngram"]["acceptance_rate"] == 1.0
    plain = stats_record(RunStats(generated=2, steps=2), 0.02)  # nothing drafted: no rate, not 0%
    assert plain["acceptance_rate"] is None and plain["drafted"] == 0
    assert set(record) == {  # what `--json` records of a reply's statistics
        "prompt_tokens", "generated_tokens", "mean_draft_length", "drafted", "accepted", "acceptance_rate",
        "acceptance_by_position", "target_decodes", "tokens_per_target_decode", "draft_lengths", "by_source",
        "take_overs", "prefill_seconds", "draft_seconds", "catch_up_seconds", "target_seconds", "other_seconds",
        "tokens_per_second", "estimated_speedup",
    }
    console_file = io.StringIO()
    Console(file=console_file, width=120).print(stats_panel(stats, target_token_seconds=0.02, title="t"))
    text = console_file.getvalue()
    assert "model 75% of 4 · ngram 100% of 7 (1 take-over)" in text and "draft 0.06 s (catch-up 0.01 s)" in text


def test_auto_drafts_by_the_profile_the_session_timed_for_its_estimate(chat_pair, monkeypatch):
    """The session times the pair as it starts: at a fixed K only what its estimated speedup needs;
    `/k auto` adds auto's verify sizes to that one profile, and then a reply times nothing more."""
    options = LoadOptions(n_ctx=512, n_threads=1)
    with Model(chat_pair[0], options) as target, Model(chat_pair[1], options) as draft:
        display = Display("plain", provenance=False, out=io.StringIO(), err=io.StringIO())
        session = ChatSession(target, draft, display, sampling=SamplingParams(temperature=0), spec="model", k=2,
                              max_tokens=8)
        assert set(session.costs.measured.decode_seconds) == {1}
        session.send("hello there")
        session.command("/k auto")
        costs = session.costs.measured
        assert session.generator.costs is session.costs
        assert set(costs.decode_seconds) == {1, 2, 4, 8, 16, 25} and costs.draft_costs["model"].token_seconds > 0
        assert session.target_token_seconds == costs.target_token_seconds
        probes = []
        monkeypatch.setattr(Model, "time_decode", lambda *args, **kwargs: probes.append(args) or 0.0)
        session.send("and again")
    assert probes == [] and session.generator.policy.name == "auto" and not session.generator.policy.needs_costs
