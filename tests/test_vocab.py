"""`speccli check-vocab` and speccli.vocab.check on tiny real GGUF files (tests/tiny_gguf.py) and llama.cpp tokenizers."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speccli.llama.tokenizer import load_vocab_only
from speccli.cli.app import app
from speccli.errors import UnreadableFileError
from speccli.vocab.check import check_pair
from speccli.vocab.sample_tokenization import SAMPLE_TEXTS
from speccli.vocab.info import read_vocab
from speccli.vocab.report import VocabVerdict
from tests.tiny_gguf import TinyConfig, Vocabulary, gpt2_vocabulary, spm_vocabulary, write_tiny_gguf

BASE = spm_vocabulary(512)
BASE_4096 = spm_vocabulary(4096)


@dataclass(frozen=True)
class Case:
    draft: TinyConfig
    target: TinyConfig
    verdict: VocabVerdict
    blocking: frozenset[str] = frozenset()  # kinds of the reasons, exactly
    also: frozenset[str] = frozenset()  # tolerated or warning kinds that must be present
    llama_cpp_accepts: bool = True


def vocab(vocabulary: Vocabulary) -> TinyConfig:
    return TinyConfig(vocab=vocabulary)


CASES = {
    # Different weights and depth, same tokenizer: the usual family pair.
    "identical": Case(TinyConfig(seed=1, n_layer=1), TinyConfig(), VocabVerdict.IDENTICAL),
    "chat template differs": Case(
        vocab(replace(BASE, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")),
        TinyConfig(), VocabVerdict.IDENTICAL, also=frozenset({"chat-template"}),
    ),
    "vocabulary-only draft": Case(TinyConfig(vocab_only=True), TinyConfig(), VocabVerdict.IDENTICAL),
    "target padded with extra tokens": Case(
        TinyConfig(), vocab(BASE.padded(64)), VocabVerdict.COMPATIBLE, also=frozenset({"target-extra-tokens"}),
    ),
    "draft padded with extra tokens": Case(
        vocab(BASE.padded(64)), TinyConfig(), VocabVerdict.INCOMPATIBLE, frozenset({"draft-extra-tokens"}),
    ),
    "one token's text changed": Case(
        vocab(BASE.with_token(400, "zzz")), TinyConfig(), VocabVerdict.INCOMPATIBLE, frozenset({"token-text"}),
        llama_cpp_accepts=False,
    ),
    "ids shifted by one": Case(
        vocab(BASE.shifted()), TinyConfig(), VocabVerdict.INCOMPATIBLE,
        frozenset({"token-text", "special-bos", "sample-tokenization"}), llama_cpp_accepts=False,
    ),
    "different BOS id": Case(
        vocab(replace(BASE, bos_id=2)), TinyConfig(), VocabVerdict.INCOMPATIBLE, frozenset({"special-bos"}),
        llama_cpp_accepts=False,
    ),
    "EOS id differs but is never added": Case(
        vocab(replace(BASE, eos_id=0)), TinyConfig(), VocabVerdict.COMPATIBLE, also=frozenset({"special-eos"}),
    ),
    # A file that leaves add_bos_token out gets llama.cpp's default (true for "llama"): the sample
    # test, which tokenizes with llama.cpp's own rules, decides.
    "add-BOS left to a default that agrees": Case(
        vocab(replace(BASE, add_bos=None)), TinyConfig(), VocabVerdict.COMPATIBLE,
        also=frozenset({"setting-add_bos_token-unstated"}),
    ),
    "pre-tokenizer left out": Case(
        vocab(replace(BASE, pre=None)), TinyConfig(), VocabVerdict.COMPATIBLE, also=frozenset({"pre-tokenizer-unstated"}),
    ),
    "scores left out": Case(
        TinyConfig(), TinyConfig(metadata={"tokenizer.ggml.scores": None}), VocabVerdict.COMPATIBLE,
        also=frozenset({"scores-unstated"}),
    ),
    "token types left out": Case(
        TinyConfig(), TinyConfig(metadata={"tokenizer.ggml.token_type": None}), VocabVerdict.COMPATIBLE,
        also=frozenset({"token-types-unstated"}),
    ),
    "add-BOS left to a default that disagrees": Case(
        vocab(replace(BASE, add_bos=None)), vocab(replace(BASE, add_bos=False)), VocabVerdict.INCOMPATIBLE,
        frozenset({"sample-framing"}), also=frozenset({"add-bos-token"}), llama_cpp_accepts=False,
    ),
    "add-BOS flag differs": Case(
        vocab(replace(BASE, add_bos=False)), TinyConfig(), VocabVerdict.INCOMPATIBLE, frozenset({"add-bos-token"}),
        llama_cpp_accepts=False,
    ),
    "different tokenizer model": Case(
        vocab(gpt2_vocabulary(512)), TinyConfig(), VocabVerdict.INCOMPATIBLE,
        frozenset({"tokenizer-model", "pre-tokenizer", "merges", "token-text", "special-bos",
                   "add-bos-token", "sample-tokenization"}),
        llama_cpp_accepts=False,
    ),
    "different pre-tokenizer": Case(
        vocab(replace(BASE, pre="qwen2")), TinyConfig(), VocabVerdict.INCOMPATIBLE, frozenset({"pre-tokenizer"}),
    ),
    "add-space-prefix differs": Case(
        vocab(replace(BASE, add_space_prefix=True)), TinyConfig(), VocabVerdict.INCOMPATIBLE,
        frozenset({"setting-add_space_prefix", "sample-tokenization"}),
    ),
    # Only the practical test can tell: same tokens, but SPM merge priorities reversed.
    "same tokens, reversed scores": Case(
        vocab(replace(BASE_4096, scores=tuple(-score for score in BASE_4096.scores))), vocab(BASE_4096),
        VocabVerdict.INCOMPATIBLE, frozenset({"sample-tokenization"}), also=frozenset({"token-score"}),
    ),
}


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("vocab_pairs")

    def files(name: str) -> tuple[Path, Path]:
        case = CASES[name]
        slug = name.replace(" ", "-").replace("'", "")
        return (
            write_tiny_gguf(directory / f"{slug}-draft.gguf", case.draft),
            write_tiny_gguf(directory / f"{slug}-target.gguf", case.target),
        )

    return files


def run_cli(*args: str):
    return CliRunner().invoke(app, ["check-vocab", *args])


def test_a_translated_pair_is_not_told_how_a_same_vocabulary_draft_treats_extra_ids(tmp_path):
    """Its drafts are translated, so "the draft never proposes them ... shown token 0" does not apply
    (check-vocab had listed it under "tolerated" for a Qwen draft of the Gemma target)."""
    draft = write_tiny_gguf(tmp_path / "draft.gguf", vocab(BASE.with_token(400, "zzz")))
    target = write_tiny_gguf(tmp_path / "target.gguf", vocab(BASE.padded(64)))
    report = check_pair(draft, target)
    kinds = {difference.kind for difference in report.differences}
    assert report.verdict is VocabVerdict.INCOMPATIBLE and "token-text" in kinds
    assert "target-extra-tokens" not in kinds


@pytest.mark.parametrize("name", CASES)
def test_verdict_reasons_and_exit_code(pair_files, name: str) -> None:
    case = CASES[name]
    draft, target = pair_files(name)
    report = check_pair(draft, target)

    kinds = {d.kind for d in report.differences}
    blocking = {d.kind for d in report.differences if d.severity.value == "blocking"}
    assert report.verdict is case.verdict
    assert report.differences or case.verdict is VocabVerdict.IDENTICAL  # a COMPATIBLE verdict names what differs
    assert blocking == case.blocking
    assert case.also <= kinds
    assert len(report.reasons) == len(case.blocking)
    assert report.llama_cpp.accepts is case.llama_cpp_accepts
    # The report mentions llama.cpp exactly when its rule disagrees with speccli's verdict.
    disagrees = case.llama_cpp_accepts == (case.verdict is VocabVerdict.INCOMPATIBLE)
    assert ("llama.cpp's own check would" in report.explain()) is disagrees

    result = run_cli(str(draft), str(target))
    assert result.exit_code == (1 if case.verdict is VocabVerdict.INCOMPATIBLE else 0), result.output
    assert f"verdict: {case.verdict.value.upper()}" in result.stdout
    for reason in report.reasons:
        assert reason in result.stdout


def test_changed_token_is_shown_side_by_side(pair_files) -> None:
    report = check_pair(*pair_files("one token's text changed"))
    (difference,) = [d for d in report.differences if d.kind == "token-text"]
    assert "at 1 shared id, first at id 400" in difference.message
    assert f"400: 'zzz' | {BASE.tokens[400]!r}" in difference.evidence
    assert report.llama_cpp.reason == "token 400 differs"


def test_shifted_ids_are_recognised_as_a_shift(pair_files) -> None:
    report = check_pair(*pair_files("ids shifted by one"))
    evidence = "\n".join(d for difference in report.differences for d in difference.evidence)
    assert "draft id i+1 holds the text of target id i" in evidence
    assert "1: '<unk>' | '<s>'" in evidence
    assert "0: draft '<pad>' type 3 | target '<unk>' type 2" in evidence  # each side's own token, by type


def test_sample_difference_names_the_text_that_differs(pair_files) -> None:
    report = check_pair(*pair_files("same tokens, reversed scores"))
    (difference,) = [d for d in report.differences if d.kind == "sample-tokenization"]
    # Measured: reversed merge priorities change prose, code, json, whitespace, emoji and markup.
    assert difference.evidence[0] == "6 of 8 samples differ: prose, code, json, whitespace, emoji, markup"
    assert difference.evidence[1] == f"prose: {SAMPLE_TEXTS['prose'][:60]!r}"
    assert difference.evidence[2].startswith("  draft  (") and difference.evidence[3].startswith("  target (")
    assert report.samples_checked == len(SAMPLE_TEXTS)


def test_draft_extra_tokens_note_what_llama_cpp_would_do(pair_files) -> None:
    report = check_pair(*pair_files("draft padded with extra tokens"))
    assert "512..575" in report.reasons[0] and "'<extra_0>'" in report.differences[0].evidence[0]
    assert "llama.cpp's own check would accept this pair" in report.explain()


def test_identical_metadata_skips_loading_tokenizers_and_differences_load_them(pair_files) -> None:
    loaded: list[Path] = []

    def recording_loader(path: Path):
        loaded.append(path)
        return load_vocab_only(path)

    check_pair(*pair_files("identical"), load_tokenizer=recording_loader)
    assert loaded == []
    draft, target = pair_files("target padded with extra tokens")
    check_pair(draft, target, load_tokenizer=recording_loader)
    assert loaded == [draft, target]


def test_json_output(pair_files) -> None:
    draft, target = pair_files("different BOS id")
    result = run_cli("--json", str(draft), str(target))
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["verdict"] == "incompatible" and report["exit_code"] == 1
    assert report["draft"]["special_ids"]["bos"] == 2 and report["target"]["special_ids"]["bos"] == 1
    assert [d["kind"] for d in report["differences"] if d["severity"] == "blocking"] == ["special-bos"]
    assert report["llama_cpp"]["accepts"] is False


def test_a_padded_target_is_tolerated_and_named(pair_files) -> None:
    report = check_pair(*pair_files("target padded with extra tokens"))
    assert report.verdict is VocabVerdict.COMPATIBLE and report.reasons == [] and report.warnings == []
    assert report.tolerated == [
        "the target has 64 ids the draft lacks (512..575): the draft never proposes them; "
        "speccli gives them draft probability 0, and where the target emits one, the draft is shown "
        "token 0 instead (it changes proposals, never the output)"
    ]


def test_read_vocab_returns_tokenizer_metadata(pair_files) -> None:
    draft, _ = pair_files("vocabulary-only draft")
    info = read_vocab(draft)
    assert (info.model, info.pre, info.size, info.tensor_count) == ("llama", "default", 512, 0)
    assert info.tokens[:3] == [b"<unk>", b"<s>", b"</s>"] and info.tokens[3] == b"<0x00>"
    assert info.special_ids == {"bos": 1, "eos": 2, "unknown": 0}
    assert info.adds_bos and not info.adds_eos
    assert info.token_types is not None and info.token_types[3] == 6


# --- files that cannot be read -------------------------------------------------------------------


def truncated_copy(source: Path, destination: Path, length: int) -> Path:
    destination.write_bytes(source.read_bytes()[:length])
    return destination


BAD_FILES = {
    "missing": (lambda good, d: d / "missing.gguf", "no such file"),
    "directory": (lambda good, d: d, "is a directory"),
    "empty": (lambda good, d: (d / "empty.gguf", (d / "empty.gguf").write_bytes(b""))[0], "not a GGUF file"),
    "not GGUF": (
        lambda good, d: (d / "notes.txt", (d / "notes.txt").write_text("hello, not a model\n"))[0],
        "not a GGUF file",
    ),
    "magic only": (lambda good, d: truncated_copy(good, d / "magic.gguf", 4), "truncated"),
    "part of the version": (lambda good, d: truncated_copy(good, d / "version.gguf", 7), "truncated"),
    "truncated header": (lambda good, d: truncated_copy(good, d / "header.gguf", 12), "truncated"),
    "truncated inside the vocabulary": (lambda good, d: truncated_copy(good, d / "vocab.gguf", 2000), "truncated"),
    "token types not one per token": (
        lambda good, d: write_tiny_gguf(d / "short-types.gguf", TinyConfig(
            vocab_only=True, metadata={"tokenizer.ggml.token_type": [1, 1, 1]},
        )),
        r"corrupt tokenizer metadata \(tokenizer\.ggml\.token_type has 3 entries for \d+ tokens\)",
    ),
    "scores a scalar": (
        lambda good, d: write_tiny_gguf(d / "scalar-scores.gguf", TinyConfig(
            vocab_only=True, metadata={"tokenizer.ggml.scores": 1.5},
        )),
        r"corrupt tokenizer metadata \(tokenizer\.ggml\.scores is not a numeric array\)",
    ),
    "a token twice": (
        lambda good, d: write_tiny_gguf(d / "twice.gguf", TinyConfig(
            vocab=spm_vocabulary().with_token(400, spm_vocabulary().tokens[401]),
        )),
        r"its vocabulary holds the token '.+' twice \(ids 400 and 401\), which llama\.cpp cannot load",
    ),
    "cut short of its tensors": (
        lambda good, d: truncated_copy(good, d / "cut.gguf", good.stat().st_size // 2),
        r"cut short: [\d,]+ bytes of the [\d,]+ its tensors need",
    ),
    "a special token id that is not one": (  # llama.cpp: "key ... has wrong type str but expected type u32"
        lambda good, d: write_tiny_gguf(d / "text-bos.gguf", TinyConfig(metadata={"tokenizer.ggml.bos_token_id": "1"})),
        r"tokenizer\.ggml\.bos_token_id holds '1', not a token id$",
    ),
    "no tokenizer metadata": (
        lambda good, d: write_tiny_gguf(d / "no-tokenizer.gguf", TinyConfig(
            vocab_only=True,
            metadata={key: None for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.pre")},
        )),
        "without tokenizer metadata",
    ),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_unreadable_file_is_one_line_naming_it_with_exit_code_2(tiny_model: Path, tmp_path: Path, name: str) -> None:
    make, expected = BAD_FILES[name]
    bad = make(tiny_model, tmp_path)
    with pytest.raises(UnreadableFileError, match=expected):
        check_pair(bad, tiny_model)

    for args in ((str(bad), str(tiny_model)), (str(tiny_model), str(bad))):
        result = run_cli(*args)
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [result.stderr.strip()]  # exactly one line
        assert result.stderr.startswith(f"error: {bad}") and re.search(expected, result.stderr)
        assert "Traceback" not in result.output


def test_an_empty_model_name_is_one_line(tiny_model: Path) -> None:
    result = run_cli("", str(tiny_model))
    assert result.exit_code == 2  # check-vocab's 1 means incompatible
    assert result.stderr == "error: a model name or path is empty; give a registry name or a GGUF path\n"


def test_file_without_read_permission(tiny_model: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(tiny_model.read_bytes())
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running with privileges that read a mode-000 file (e.g. root)")
        result = run_cli(str(locked), str(tiny_model))
        assert result.exit_code == 2
        assert result.stderr.strip() == f"error: {locked}: permission denied"
    finally:
        locked.chmod(0o600)


# --- the real Gemma 3 270M file ------------------------------------------------------------------


@pytest.mark.gemma
def test_gemma_vocabulary_is_read_from_metadata() -> None:
    """The real 262,144-token vocabulary. (Speed is measured outside the tests: the whole
    `speccli check-vocab` command takes about 0.45 s on this file.)"""
    from speccli.models.config import load_registry
    from speccli.models.resolve import resolve_model

    path = resolve_model("gemma3-270m-q4km", load_registry(), quiet=True)
    report = check_pair(path, path)
    assert report.verdict is VocabVerdict.IDENTICAL and report.draft.size == 262_144
    assert report.draft.special_ids["bos"] == 2


def test_an_unknown_model_name_exits_2_not_1_which_means_incompatible(tiny_model: Path) -> None:
    result = CliRunner().invoke(app, ["check-vocab", "no-such-model", str(tiny_model)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: unknown model 'no-such-model'")
    assert result.stderr.count("\n") == 1
