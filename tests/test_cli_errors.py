"""Bad input at the command line, as a hostile user would give it (issue 12): every case is one line
naming the thing and what is wrong, with the documented exit code, and is refused before any model
loads; input that can be repaired (bytes that are not UTF-8) is repaired and said so.

Runs the real CLI on tiny real GGUF files (tests/conftest.py), and once a real subprocess for Ctrl-C.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speccli.cli.app import app
from speccli.errors import SpeccliError, UnreadableFileError
from speccli.gguf_files import require_gguf
from speccli.gguf_meta import read_gguf_metadata
from speccli.llama.model import LoadOptions, Model
from speccli.models.pair import fitted_context
from speccli.validation import check_seed
from tests.tiny_gguf import TinyConfig, poisoned_copy, spm_vocabulary, write_tiny_gguf

REPO = Path(__file__).resolve().parents[1]
MISSING_MODEL = "/nonexistent/model.gguf"  # an argument that fails if anything tries to load it


def speccli(*args: str, input: str | bytes | None = None):
    env = {"TTY_COMPATIBLE": "0", "FORCE_COLOR": None, "NO_COLOR": None, "COLUMNS": "100"}
    return CliRunner(env=env).invoke(app, list(args), input=input, catch_exceptions=False, prog_name="speccli")


def chat(pair, *args: str, input: str | bytes | None = None):
    target, draft = pair
    return speccli("chat", "-m", str(target), "-md", str(draft), "-t", "1", "-c", "256", "-n", "4", *args, input=input)


def assert_one_line(result, line: str, exit_code: int) -> None:
    assert result.exit_code == exit_code, result.output
    assert result.stderr == line + "\n"
    assert result.stdout == ""


# --- 19: usage errors are one line, exit 2 --------------------------------------------------------


@pytest.mark.parametrize(
    "args, line",
    [
        (["chat", "--top-k", "abc"], "error: speccli chat: Invalid value for '--top-k': Input should be a valid "
         "integer, unable to parse string as an integer (see 'speccli chat --help')"),
        (["pull"], "error: speccli pull: Missing argument 'NAME'. (see 'speccli pull --help')"),
        (["chat", "--bogus"], "error: speccli chat: No such option: --bogus (see 'speccli chat --help')"),
        (["nosuch"], "error: speccli: No such command 'nosuch'. (see 'speccli --help')"),
        # Click's parser raises this one without naming the command: found in the command line.
        (["chat", "--remember=false"], "error: speccli chat: Option '--remember' does not take a value. (see 'speccli chat --help')"),
        # An empty path: Typer's Path read it as '.', "--json .: is a directory", or served '.' as rpc-server's cache.
        (["bench", "--json", ""], "error: speccli bench: Invalid value for '--json': empty; give a file name, or - for "
         "stdout (see 'speccli bench --help')"),
        (["bench", "--config", "x.toml", "--config", " "], "error: speccli bench: Invalid value for '--config': empty; "
         "give a models.toml (see 'speccli bench --help')"),
        (["bench", "--compare", "a.json", ""], "error: speccli bench: Invalid value for '--compare': empty; give two "
         "--json reports (see 'speccli bench --help')"),
        (["rpc-server", "--cache", "", "--port", "0"], "error: speccli rpc-server: Invalid value for '--cache' / '-c': "
         "empty; give a folder (see 'speccli rpc-server --help')"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(args, line):
    assert_one_line(speccli(*args), line, 2)


# --- 18, 12, 16, 9: settings refused as the line is parsed, before anything loads -------------------


@pytest.mark.parametrize(
    "args, line",
    [
        (["bench", "--k", "-1"], "error: --k '-1': K (draft tokens per step) must be between 1 and 64, got -1"),
        (["bench", "--k", "2,-3"], "error: --k '2,-3': K (draft tokens per step) must be between 1 and 64, got -3"),
        (["chat", "--temp", "inf"], "error: --temp must be a finite number, got inf"),
        (["chat", "--temp", "nan"], "error: --temp must be a finite number, got nan"),
        (["bench", "--temp", "inf"], "error: --temp must be a finite number, got inf"),
        (["chat", "--top-p", "nan"], "error: --top-p must be a finite number, got nan"),
        (["chat", "--min-p", "-inf"], "error: --min-p must be a finite number, got -inf"),
        (["chat", "--ngl", "-5"], "error: --ngl must be a number of layers, or -1 for all, got -5"),
        (["bench", "--ngl-draft", "-7"], "error: --ngl-draft must be a number of layers, or -1 for all, got -7"),
        (["chat", "--seed", "-2"], "error: --seed must be >= 0, or -1 for a random seed, got -2"),
        (["bench", "--seed", "-2"], "error: --seed must be >= 0, or -1 for a random seed, got -2"),
        (["chat", "--ctx", "8"], "error: --ctx must be at least 16 tokens, got 8"),
    ],
)
def test_bad_settings_are_refused_before_any_model_is_named_or_loaded(args, line):
    assert_one_line(speccli(*args, "-m", MISSING_MODEL), line, 1)


@pytest.mark.parametrize("command", ["chat", "bench"])
def test_an_empty_json_schema_is_said_to_be_empty(command):
    """`--json-schema ''` had said "--json-schema .: is a directory": the empty path read as the folder."""
    line = "error: --json-schema: empty; give a schema's file, or the schema as JSON"
    assert_one_line(speccli(command, "--json-schema", " ", "-m", MISSING_MODEL), line, 2)


def test_a_k_list_with_an_item_that_is_not_a_number_is_a_usage_error():
    line = "error: --k '1,x': 'x' is not auto, a number or a range; give auto, a number (4), a list (auto,1,2,4) or a range (1-8)"
    assert_one_line(speccli("bench", "--k", "1,x", "-m", MISSING_MODEL), line, 2)


def test_seed_minus_one_draws_a_seed_and_others_pass_unchanged():
    drawn = {check_seed(-1) for _ in range(20)}
    assert all(0 <= seed < 2**32 for seed in drawn) and len(drawn) > 1
    assert check_seed(7) == 7 and check_seed(None) is None


def test_seed_minus_one_means_random_in_chat(tiny_pair):
    result = chat(tiny_pair, "-p", "hello", "--seed", "-1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[0])["finish_reason"] in ("max_tokens", "stop")


# --- the reader of stdout went away: exit 141 -----------------------------------------------------------


def speccli_to_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """`speccli ARGS | head` where head has already quit: every write to stdout fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "speccli", *args], cwd=REPO, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)


def test_a_reader_that_went_away_is_exit_141_without_a_word(tiny_pair, tmp_path):
    """rich ends the process with exit 1 on a broken pipe, and Click does for its own writes: the
    docs/cli.md promises 141 (as a shell reports SIGPIPE), for help and reports alike."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on\n")
    bench = ["bench", "-m", str(tiny_pair.target), "-md", str(tiny_pair.draft), "--k", "2", "-n", "4", "--runs", "1",
             "--warmup", "0", "--threads", "1", "--prompts", str(prompts)]
    for args in (["--help"], ["--version"], [], ["models"], bench):
        done = speccli_to_a_closed_pipe(*args)
        assert (done.returncode, done.stderr) == (141, ""), args


def test_help_reads_at_80_columns():
    """Typer's boxed help left `chat`'s descriptions 14 columns, a word or two a line, at 80."""
    done = subprocess.run([sys.executable, "-m", "speccli", "chat", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)})
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and max(map(len, lines)) <= 80
    assert any(line.startswith("  -m, --target MODEL") and "Target model: registry name or GGUF path" in line for line in lines)


def test_bare_speccli_prints_its_help_and_no_error_line():
    done = subprocess.run([sys.executable, "-m", "speccli"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Usage: speccli" in done.stdout and done.stderr == ""


# --- 4: --ctx beyond the models' training context --------------------------------------------------


def test_ctx_beyond_the_training_context_is_refused_before_loading(tiny_pair):
    """The model is named as the user named it (a registry name, or the path as given), not by its file
    in a cache (`F32-a5fd3b62230aa5ec.gguf` for the default pair's target)."""
    started = time.perf_counter()
    result = chat(tiny_pair, "-p", "hello", "--ctx", "1000000000")
    assert_one_line(
        result, f"error: --ctx 1000000000 is more than the 512 tokens {tiny_pair.target} was trained with; "
        "use at most 512", 1,
    )
    assert time.perf_counter() - started < 5


def test_the_default_ctx_is_lowered_to_what_the_models_were_trained_with(tiny_pair, tmp_path):
    """chat's default --ctx is 4096, bench's and quant-check's 2048; these models were trained with 512
    tokens. Not given, --ctx is lowered to that (bench reports and repeats it); given, it is refused
    (the test above)."""
    target, draft = map(str, tiny_pair)
    result = speccli("chat", "-m", target, "-md", draft, "-t", "1", "-n", "4", "-p", "hello", "--json")
    assert result.exit_code == 0, result.output
    prompts, report = tmp_path / "prompts.txt", tmp_path / "report.json"
    prompts.write_text("the cat sat on\n")
    result = speccli("bench", "-m", target, "-md", draft, "--k", "2", "-n", "4", "--runs", "1", "--warmup", "0",
                     "--threads", "1", "--prompts", str(prompts), "--json", str(report))
    assert result.exit_code == 0, result.output
    written = json.loads(report.read_text())
    assert written["settings"]["n_ctx"] == 512
    assert "--ctx 512 " in written["command"]
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat " * 20)
    result = speccli("quant-check", target, target, "--text", str(text), "--threads", "1", "--json")
    assert result.exit_code == 0, result.output


def test_the_default_context_is_the_shortest_any_model_was_trained_with(tmp_path):
    short = write_tiny_gguf(tmp_path / "short.gguf", TinyConfig(context_length=300))
    long = write_tiny_gguf(tmp_path / "long.gguf", TinyConfig(context_length=1000))
    assert fitted_context(None, 4096, [long, short, None]) == 300
    assert fitted_context(None, 256, [long, short]) == 256  # the command's default, where that is less
    assert fitted_context(2000, 4096, [long, short]) == 2000  # as given: loading refuses it
    assert fitted_context(None, 4096, [long, short], n_seq=4) == 1200  # serve's slots: each its own by default
    assert fitted_context(2000, 4096, [long, short], n_seq=4) == 2000  # given: split between them


def test_a_model_trained_with_less_than_the_least_context_is_refused_before_loading(tiny_pair, tmp_path):
    """A model trained with 8 tokens had run at 8, below --ctx's least (16), in chat; --ctx 16 was "use at most 8"."""
    short = write_tiny_gguf(tmp_path / "short.gguf", TinyConfig(context_length=8))
    line = f"error: {short}: the model was trained with a context of 8 tokens, below speccli's minimum of 16 tokens"
    target, prompts = str(tiny_pair.target), tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on\n")
    alone = ["-m", str(short), "--spec", "ngram"]
    for args in (["chat", *alone, "-p", "hi"], ["chat", *alone, "-p", "hi", "--ctx", "16"],
                 ["bench", *alone, "--k", "2", "--prompts", str(prompts)]):
        assert_one_line(speccli(*args), line, 1)
    assert_one_line(speccli("quant-check", str(short), str(short)), line, 2)  # quant-check's 1 is its verdict
    # A draft trained so, with a target that is not: refused before either loads (llama.cpp logs no load).
    for args in (["chat", "-m", target, "-md", str(short), "-p", "hi"],
                 ["serve", "-m", target, "-md", str(short), "--port", "0"]):
        done = subprocess.run([sys.executable, "-m", "speccli", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONPATH": str(REPO), "SPECCLI_LLAMA_LOG": "1"})
        assert (done.returncode, done.stderr) == (1, line + "\n"), args


def test_a_context_too_big_for_memory_is_one_line_naming_ctx(tmp_path):
    """A model trained for a context whose KV cache is 4x this machine's memory and swap: llama.cpp's
    allocation fails at once (no page is touched) and says so in one line."""
    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() != "0":
        pytest.skip("needs Linux's heuristic overcommit (mode 0), which refuses an allocation larger than memory + swap")
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    memory_and_swap = sum(int(meminfo[key].split()[0]) * 1024 for key in ("MemTotal", "SwapTotal"))
    config = TinyConfig(n_layer=64, n_head_kv=4)
    kv_bytes_per_token = config.n_layer * 2 * config.n_head_kv * config.head_dim * 2  # K and V, f16
    n_ctx = 4 * memory_and_swap // kv_bytes_per_token
    path = write_tiny_gguf(tmp_path / "deep.gguf", replace(config, context_length=n_ctx))
    with pytest.raises(SpeccliError, match=rf"^{path}: not enough memory for a {n_ctx}-token context; lower --ctx \(llama.cpp: .*memory"):
        Model(path, LoadOptions(n_ctx=n_ctx, n_threads=1))


# --- 15 and 5: the message itself -----------------------------------------------------------------------


@pytest.mark.parametrize("args, stdin, line", [
    (["-p", "-"], "", "error: the prompt read from stdin (--prompt -) is empty"),
    (["-p", "-"], " \n\n", "error: the prompt read from stdin (--prompt -) is empty"),
    (["-p", ""], None, "error: the prompt (--prompt) is empty"),
])
def test_an_empty_prompt_is_refused_whether_given_or_read_from_stdin(args, stdin, line):
    assert_one_line(speccli("chat", "-m", MISSING_MODEL, *args, input=stdin), line, 1)


@pytest.mark.parametrize("args, line", [
    (["-p", "-"], "error: stdin is closed, so there is no message to read (--prompt -); give it with --prompt TEXT"),
    ([], "error: stdin is closed, so there are no messages to read; give one with --prompt, or pipe them in"),
], ids=["--prompt -", "turns"])
def test_a_closed_stdin_is_one_line_before_any_model_loads(args, line):
    """`chat -p - <&-` had been a traceback ('NoneType' object has no attribute 'buffer'), and a chat
    reading turns loaded both models before its traceback (isatty)."""
    result = subprocess.run([sys.executable, "-m", "speccli", "chat", "-m", MISSING_MODEL, *args], cwd=REPO,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                            preexec_fn=lambda: os.close(0))
    assert (result.returncode, result.stderr, result.stdout) == (2, line + "\n", "")


REPAIRED = "(the message had bytes that are not UTF-8; each became U+FFFD)"


def test_piped_lines_that_are_not_utf8_are_repaired_and_the_session_goes_on(tiny_pair):
    result = chat(tiny_pair, "--json", "--temp", "0", input=b"caf\xe9 au lait\nsecond turn\n")
    assert result.exit_code == 0, result.output
    replies = [record for record in map(json.loads, result.stdout.splitlines()) if "prompt" in record]
    assert [reply["prompt"] for reply in replies] == ["caf\ufffd au lait", "second turn"]
    assert result.stderr.count(REPAIRED) == 1


@pytest.mark.parametrize("how", ["argument", "stdin"])
def test_a_prompt_that_is_not_utf8_is_repaired(tiny_pair, how):
    # Python hands an argument's undecodable bytes over as surrogate escapes (os.fsdecode).
    args, stdin = (["-p", os.fsdecode(b"caf\xe9")], None) if how == "argument" else (["-p", "-"], b"caf\xe9")
    result = chat(tiny_pair, "--json", *args, input=stdin)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[0])["prompt"] == "caf\ufffd"
    assert REPAIRED in result.stderr


# --- 11: a model path that is not UTF-8 ----------------------------------------------------------------


@pytest.fixture
def non_utf8_pair(tiny_pair, tmp_path):
    directory = os.fsdecode(bytes(tmp_path) + b"/bad\xffdir")
    os.mkdir(directory)
    target, draft = (os.path.join(directory, name) for name in ("target.gguf", os.fsdecode(b"draft\xfe.gguf")))
    shutil.copyfile(tiny_pair.target, target)
    shutil.copyfile(tiny_pair.draft, draft)
    return target, draft


def test_chat_loads_a_model_whose_path_is_not_utf8(non_utf8_pair):
    result = chat(non_utf8_pair, "-p", "hello", "--json")
    assert result.exit_code == 0, result.output
    assert "prompt" in json.loads(result.stdout.splitlines()[0])


def test_bench_loads_a_model_whose_path_is_not_utf8(non_utf8_pair, tmp_path):
    target, draft = non_utf8_pair
    prompts = tmp_path / "prompts.txt"  # the built-in set's longest prompts do not fit these models' 512 tokens
    prompts.write_text("the cat sat on\nonce upon a time\n")
    result = speccli("bench", "-m", target, "-md", draft, "--k", "2", "-n", "4", "--runs", "1", "--warmup", "0",
                     "--ctx", "512", "--threads", "1", "--prompts", str(prompts))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


def test_json_naming_a_path_that_is_not_utf8_is_still_utf8(non_utf8_pair, tmp_path):
    """JSON text must be UTF-8: a name's stray byte is written as it is on stderr (\\udcfe), where
    check-vocab wrote the raw byte (no parser read it) and bench --json failed to serialize."""
    target, draft = non_utf8_pair
    done = subprocess.run([sys.executable, "-m", "speccli", "check-vocab", "--json", draft, target], cwd=REPO,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode("utf-8"))["draft"]["path"].endswith("draft\\udcfe.gguf")
    prompts, report = tmp_path / "prompts.txt", tmp_path / "report.json"
    prompts.write_text("the cat sat on\n")
    result = speccli("bench", "-m", target, "-md", draft, "--k", "2", "-n", "4", "--runs", "1", "--warmup", "0",
                     "--threads", "1", "--prompts", str(prompts), "--json", str(report))
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_bytes().decode("utf-8"))["models"]["draft"]["path"].endswith("draft\\udcfe.gguf")


def test_an_error_naming_a_path_that_is_not_utf8_names_it_as_its_bytes(non_utf8_pair, tmp_path):
    """As `ls` writes it, as stdout does: the line had said `gone\\udcff.gguf`, a name on no disk."""
    target, _ = non_utf8_pair
    missing = os.fsdecode(bytes(tmp_path) + b"/gone\xff.gguf")
    done = subprocess.run([sys.executable, "-m", "speccli", "chat", "-m", target, "-md", missing, "-p", "hello"], cwd=REPO,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr == b"error: " + bytes(tmp_path) + b"/gone\xff.gguf: no such file\n"


def test_a_model_file_cut_short_is_one_line_before_llama_cpp_reads_it(tiny_pair, tmp_path):
    whole = tiny_pair.target.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    result = speccli("chat", "-m", str(cut), "--spec", "ngram", "-t", "1", "-c", "256", "-p", "hello")
    assert_one_line(result, f"error: {cut}: cut short: {len(whole) // 2:,} bytes of the {len(whole):,} its tensors need", 2)


def test_a_split_model_with_a_later_part_cut_short_or_missing_is_one_line(tmp_path):
    """llama.cpp is given a split model's first file and opens the others itself: each is checked."""
    first = write_tiny_gguf(tmp_path / "tiny.gguf", split_max_tensors=4)
    parts = sorted(tmp_path.glob("tiny-*-of-*.gguf"))
    assert first == parts[0] and first.name.startswith("tiny-00001-of-") and len(parts) >= 3
    args = ("chat", "-m", str(first), "--spec", "ngram", "-t", "1", "-c", "256", "-n", "2", "-p", "hello")
    assert speccli(*args).exit_code == 0  # whole, it loads

    whole = parts[1].read_bytes()
    parts[1].write_bytes(whole[:-1])
    cut_short = f"error: {parts[1]}: cut short: {len(whole) - 1:,} bytes of the {len(whole):,} its tensors need"
    assert_one_line(speccli(*args), cut_short, 2)
    assert_one_line(speccli("check-vocab", str(first), str(first)), cut_short, 2)  # no pair could load it
    parts[-1].unlink()
    parts[1].write_bytes(whole)
    assert_one_line(speccli(*args), f"error: {parts[-1]}: no such file", 2)


def test_a_vocabulary_with_a_token_twice_is_one_line_not_an_abort_in_llama_cpp(tmp_path):
    """llama.cpp's vocabulary loader asserts that every token text is distinct: the process aborted
    (exit 134, a debugger's backtrace on stdout)."""
    vocab = spm_vocabulary()
    twice = write_tiny_gguf(tmp_path / "twice.gguf", TinyConfig(vocab=vocab.with_token(400, vocab.tokens[401])))
    result = speccli("chat", "-m", str(twice), "--spec", "ngram", "-t", "1", "-c", "256", "-p", "hello")
    assert_one_line(result, f"error: {twice}: its vocabulary holds the token {vocab.tokens[401]!r} twice (ids 400 and 401), "
                            "which llama.cpp cannot load", 2)


def test_empty_token_texts_are_not_taken_for_a_token_twice(tmp_path):
    """llama.cpp renames each empty token text "[EMPTY_<id>]": such a vocabulary loads, and runs."""
    vocab = spm_vocabulary()
    empty = write_tiny_gguf(tmp_path / "empty.gguf", TinyConfig(vocab=vocab.with_token(400, "").with_token(401, "")))
    result = speccli("chat", "-m", str(empty), "--spec", "ngram", "-t", "1", "-c", "256", "-n", "2", "-p", "hello")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("broken, args", [
    ("target", []), ("target", ["--temp", "0"]), ("draft", ["--spec", "model", "--k", "2"]),
    ("draft", ["--spec", "model", "--k", "2", "--temp", "0"]),
], ids=["target", "target, greedy", "draft", "draft, greedy"])
def test_a_model_whose_logits_are_nan_is_named_in_one_line(tiny_pair, tmp_path, broken, args):
    """Chat's default filters had met NaN logits with a traceback (zero-size array to reduction operation
    maximum), and greedy decoding with a reply of token 0 (argmax takes NaN for the largest), exit 0."""
    pair = tiny_pair._replace(**{broken: poisoned_copy(getattr(tiny_pair, broken), tmp_path / f"nan-{broken}.gguf")})
    result = chat(pair, "-p", "hello", *args)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1] == (
        f"error: {getattr(pair, broken)} (the {broken} model): its logits are not finite (NaN or infinity), so no "
        "token can be drawn from them; check the file against its source")
    assert result.stdout == ""


# --- 17: a loop of symbolic links ---------------------------------------------------------------------


def test_a_symlink_loop_is_named_as_such_not_as_a_missing_file(tmp_path):
    (tmp_path / "a.gguf").symlink_to(tmp_path / "b.gguf")
    (tmp_path / "b.gguf").symlink_to(tmp_path / "a.gguf")
    (tmp_path / "dangling.gguf").symlink_to(tmp_path / "gone.gguf")
    for read in (require_gguf, lambda path: read_gguf_metadata(path, lambda key: True)):
        with pytest.raises(UnreadableFileError, match=r"a\.gguf: a loop of symbolic links, not a file$"):
            read(tmp_path / "a.gguf")
        with pytest.raises(UnreadableFileError, match=r"dangling\.gguf: a symbolic link to .*gone\.gguf, which does not exist$"):
            read(tmp_path / "dangling.gguf")


# --- 6: Ctrl-C while a model loads -----------------------------------------------------------------------


INTERRUPTS = pytest.mark.parametrize(
    ("interrupt", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"]
)


@INTERRUPTS
def test_an_interrupt_during_model_load_ends_it_promptly_without_a_traceback(tiny_pair, interrupt, exit_code):
    """The signal is sent as soon as llama.cpp logs that it began reading the first model, so it lands
    while llama.cpp, not Python, is running: the case the log callback used to swallow. SIGTERM
    unwinds the same way, with its own exit code."""
    command = [sys.executable, "-m", "speccli", "chat", "-m", str(tiny_pair.target), "-md", str(tiny_pair.draft),
               "-t", "1", "-c", "256", "-p", "hello"]
    env = dict(os.environ, SPECCLI_LLAMA_LOG="1", PYTHONPATH=str(REPO))
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = []
    for line in process.stderr:
        log.append(line)
        if b"llama_model_loader:" in line:
            process.send_signal(interrupt)
            sent = time.perf_counter()
            break
    else:
        pytest.fail("llama.cpp never logged the model load: " + b"".join(log).decode(errors="replace"))
    stdout, rest = process.communicate(timeout=30)
    stopped_after = time.perf_counter() - sent
    log_text = (b"".join(log) + rest).decode(errors="replace")
    assert process.returncode == exit_code, log_text[-2000:]
    assert "Traceback" not in log_text and "Exception ignored" not in log_text
    assert stdout == b""  # no reply: it stopped before generating
    assert stopped_after < 5


def test_an_interrupt_while_a_model_is_freed_never_frees_it_twice(tiny_pair):
    """A Ctrl-C just as chat ended (between two of llama.cpp's free calls in Model.close) left the
    model's fields set, and __del__ freed them again: 'double free or corruption', exit 134. Here the
    interrupt is raised after the batch is freed, then the model is dropped, as at exit."""
    script = (
        "import sys, llama_cpp\n"
        "from speccli.llama.model import LoadOptions, Model\n"
        "model = Model(sys.argv[1], LoadOptions(n_ctx=64, n_threads=1))\n"
        "free_batch = llama_cpp.llama_batch_free\n"
        "def freed_then_interrupted(batch):\n"
        "    free_batch(batch)\n"
        "    raise KeyboardInterrupt\n"
        "llama_cpp.llama_batch_free = freed_then_interrupted\n"
        "try:\n"
        "    model.close()\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
        "llama_cpp.llama_batch_free = free_batch\n"
        "del model\n"
        "print('closed once')\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(tiny_pair.target)], cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert (result.returncode, result.stdout) == (0, "closed once\n"), result.stderr[-2000:]


@pytest.mark.gemma
@INTERRUPTS
def test_an_interrupt_during_a_derive_build_ends_it_promptly_and_leaves_no_file(tmp_path, interrupt, exit_code):
    """The F32 build of the Gemma Q4_K_M file (about 1 GB, several seconds) is interrupted once its
    partial file exists: llama.cpp's quantizer cannot be cancelled, so it runs on a worker thread and
    the waiting main thread takes the Ctrl-C at once. SIGTERM, which would otherwise end the process
    where it stands, leaves no temporary file either."""
    from speccli.models.config import load_registry
    from speccli.models.resolve import resolve_model

    source = resolve_model("gemma3-270m-q4km", load_registry(), quiet=True)
    config = tmp_path / "models.toml"
    config.write_text(f'[models.base]\npath = "{source}"\n\n[models.upcast]\nderive = {{ from = "base", ftype = "F32" }}\n')
    cache = tmp_path / "cache"
    command = [sys.executable, "-m", "speccli", "pull", "upcast", "--config", str(config)]
    env = dict(os.environ, SPECCLI_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list(cache.rglob("*.partial")):
        assert process.poll() is None and time.monotonic() < deadline, "the build never started"
        time.sleep(0.05)
    process.send_signal(interrupt)
    sent = time.perf_counter()
    stdout, stderr = process.communicate(timeout=60)
    stopped_after = time.perf_counter() - sent
    assert process.returncode == exit_code, stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in stderr and b"Exception ignored" not in stderr
    assert stopped_after < 2
    assert [p for p in cache.rglob("*") if p.is_file() and p.suffix in (".gguf", ".partial")] == []


@pytest.mark.parametrize(
    ("switch", "env", "traceback_shown"),
    [(["--debug"], {}, True), ([], {"SPECCLI_DEBUG": "1"}, True), ([], {"SPECCLI_DEBUG": "0"}, False), ([], {}, False)],
    ids=["--debug", "SPECCLI_DEBUG=1", "SPECCLI_DEBUG=0", "neither"],
)
def test_debug_adds_the_traceback_and_changes_no_exit_code(tmp_path, switch, env, traceback_shown):
    """A script run with --debug must see the same exit codes (a missing file is 2, in check-vocab too)."""
    missing = tmp_path / "gone.gguf"
    clean = {name: value for name, value in os.environ.items() if name != "SPECCLI_DEBUG"}
    for command in (["chat", "-m", str(missing), "-p", "hi"], ["check-vocab", str(missing), str(missing)]):
        result = subprocess.run([sys.executable, "-m", "speccli", *switch, *command], cwd=REPO, capture_output=True,
                                text=True, env={**clean, "PYTHONPATH": str(REPO), **env})
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines()[-1] == f"error: {missing}: no such file"
        assert ("Traceback" in result.stderr) == traceback_shown


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("command", [["models"], ["env"], ["bench", "--schema"], ["--version"], ["--help"], []])
def test_a_full_stdout_is_named(command):
    """"error: No space left on device" alone had named nothing: the disk looked full."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "speccli", *command], cwd=REPO, stdout=full, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (result.returncode, result.stderr) == (2, "error: stdout: No space left on device\n")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("json_records", [False, True])
def test_a_full_stdout_is_named_by_chat_too(tiny_pair, json_records):
    """chat writes its reply through an object of its own, which the check for stdout had not looked into."""
    command = ["chat", "-m", str(tiny_pair.target), "--spec", "ngram", "-t", "1", "-c", "256", "-n", "4", "-p", "hi"]
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "speccli", *command, *(["--json"] if json_records else [])],
                                cwd=REPO, stdout=full, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (result.returncode, result.stderr.splitlines()[-1]) == (2, "error: stdout: No space left on device")


def test_a_closed_stdout_is_an_error_not_a_silent_success(tmp_path):
    """`speccli check-vocab A B >&-`: Python's sys.stdout is None and every print vanished, exit 0."""
    missing = tmp_path / "x.gguf"
    result = subprocess.run([sys.executable, "-m", "speccli", "check-vocab", str(missing), str(missing)], cwd=REPO,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                            preexec_fn=lambda: os.close(1))
    assert (result.returncode, result.stderr) == (2, "error: stdout is closed, so the output would go nowhere\n")


@pytest.mark.parametrize("args", [["--version"], ["--help"], []], ids=["--version", "--help", "bare"])
def test_the_top_levels_own_output_to_a_closed_stdout_is_an_error_too(args):
    """What the top level prints as its line is read (versions, help) had vanished with exit 0 (bare
    `speccli`: exit 2 without a word)."""
    result = subprocess.run([sys.executable, "-m", "speccli", *args], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=lambda: os.close(1))
    assert (result.returncode, result.stderr) == (2, "error: stdout is closed, so the output would go nowhere\n")


def test_each_commands_help_paragraphs_are_one_line_each_so_they_wrap_at_the_terminals_width() -> None:
    """Typer keeps a docstring's line breaks: a paragraph broken in the source broke mid-sentence at
    80 columns ('expected speculative acceptance' then 'Σmin(p,q), top-1 ...' on a line of its own)."""
    commands = [command for command in app.registered_commands if command.callback is not None]
    assert len(commands) >= 8
    for command in commands:
        for paragraph in (command.callback.__doc__ or "").strip().split("\n\n"):
            assert "\n" not in paragraph.strip(), f"{command.callback.__name__}: {paragraph!r}"


def test_an_rpc_cache_that_is_a_file_is_named_so(tmp_path):
    """`--cache /etc/passwd` had said "cannot create it (File exists)", exit 1."""
    afile = tmp_path / "afile"
    afile.write_text("")
    result = speccli("rpc-server", "--cache", str(afile), "--port", "0")
    assert_one_line(result, f"error: --cache {afile}: a file, not a folder", 2)


def test_env_says_gpu_offload_only_where_a_gpu_is():
    """llama.cpp's `supports_gpu_offload` is true wherever its RPC backend is built, GPU or none: `env`
    had said "gpu offload supported" on a machine with no GPU."""
    from speccli.llama import rpc

    result = speccli("env")
    line = next(line for line in result.stdout.splitlines() if line.startswith("gpu offload"))
    has_gpu = any(device.is_local_accelerator for device in rpc.devices())
    assert result.exit_code == 0 and (line.split(None, 2)[2] == "supported") == has_gpu, line


@pytest.mark.parametrize(("schema", "line"), [
    ("[1, 2]", "error: --json-schema: a JSON schema must be an object or a boolean, got list"),  # had been "no such file"
    ("3", "error: --json-schema: a JSON schema must be an object or a boolean, got int"),
    ("false", "error: --json-schema: no text satisfies it (false, the schema nothing satisfies)"),
    ("missing.schema.json", "error: --json-schema missing.schema.json: no such file"),  # the control: a file's name
])
def test_json_that_is_no_object_is_read_as_a_schema_not_a_file_name(schema, line):
    assert_one_line(speccli("chat", "--json-schema", schema, "-m", MISSING_MODEL), line, 2)


@pytest.mark.parametrize(("args", "line"), [
    (["bench", "--spec", "ngram", "--ngl-draft", "5"], "error: --ngl-draft: --spec ngram loads no draft model; drop --ngl-draft"),
    (["chat", "--spec", "suffix", "--ngl-draft", "0"], "error: --ngl-draft: --spec suffix loads no draft model; drop --ngl-draft"),
    (["chat", "--spec", "ngram", "--rpc", "127.0.0.1:50052", "--rpc-draft"],
     "error: --rpc-draft: --spec ngram loads no draft model; drop --rpc-draft"),
])
def test_an_option_for_a_draft_model_that_will_not_load_cannot_go_with_that_spec(args, line):
    """They had been ignored without a word, where a --draft given there is refused."""
    assert_one_line(speccli(*args, "-m", MISSING_MODEL), line, 2)
