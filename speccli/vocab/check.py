"""Can this draft draft for this target? A vocabulary check that reads metadata only, no weights.

speccli feeds the target's token ids to the draft and verifies the draft's proposed ids against the
target's distribution over the target's vocabulary. That is only worth doing when an id means the same
text to both models and both turn the same text into the same ids. Verdicts:

IDENTICAL     every tokenizer field is equal (tokens, types, scores, merges, special ids, flags). A
              differing chat template is only a warning: it shapes prompts, not ids.
COMPATIBLE    the ids both files share mean the same text and text tokenizes the same way; speculative
              decoding is exact. Tolerated, and named in the report:
              - the target has extra ids past the draft's last one (converters pad embedding rows).
                The draft never proposes them and the verifier pads q with zeros to the target's width,
                so a rejection's residual max(0, p - q) keeps all of the target's mass on them: the
                output is exactly the target's. (Should the target emit one, the engine has to map it
                to an id the draft can read before feeding it back; the draft's q stays a valid proposal.)
              - token types or scores differ while the sample text still tokenizes identically;
                EOS (when not added to prompts), EOT, padding and other special ids differ: they move
                acceptance at the end of a turn, not the meaning of ids.
INCOMPATIBLE  a reason below, each with evidence:
              - tokenizer model, pre-tokenizer, merge rules or a tokenization setting differ;
              - token text differs at a shared id (the first mismatches side by side);
              - the draft has ids the target lacks: the draft can propose them, and the target, which
                evaluates every proposal, cannot decode ids past its vocabulary (llama.cpp tolerates a
                difference of up to 128);
              - BOS framing differs (add-BOS flag, or BOS id when BOS is added), or EOS framing when EOS
                is added: the draft would see sequence starts or ends it never saw in training;
              - a built-in sample of varied text tokenizes to different ids.
Each report also says what llama.cpp's own rule (`common_speculative_are_compatible`: same vocab
type, matching add-BOS/EOS flags and ids when added, sizes within 128, equal token text from id 5 on)
would decide when it disagrees.

Metadata comes from `speccli.gguf_meta`, which reads only the GGUF header.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from speccli.errors import SpeccliError, UnreadableFileError
from speccli.gguf_meta import read_gguf_metadata

LLAMA_CPP_MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE in llama.cpp common/speculative.cpp
LLAMA_CPP_CHECK_START_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID: llama.cpp ignores text of ids below this
SHOWN_MISMATCHES = 5

# Varied text for the practical test: each kind exercises a different part of a tokenizer
# (pre-tokenizer regexes, byte fallback, digit splitting, whitespace handling).
SAMPLE_TEXTS: dict[str, str] = {
    "prose": "The quick brown fox jumps over the lazy dog. It wasn't me, she said; \"really?\"",
    "code": "def main(argv):\n    for i in range(10):\n        print(f\"{i:>4}\", argv[i % 2])\n    return 0\n",
    "json": '{"name": "speccli", "version": [0, 1, 0], "ok": true, "nested": {"a": null}}',
    "numbers": "3.14159 2,718 1e-9 0x1F 1234567890 -42 +7 50% 12:30 2024-05-01",
    "whitespace": "  leading\ttab\n\n\nthree newlines    four spaces\r\nwindows line\u00a0nbsp  ",
    "non-latin": "Привет, мир. 你好，世界。こんにちは。안녕하세요. مرحبا بالعالم. नमस्ते दुनिया. Γειά σου.",
    "emoji": "Ship it 🚀🔥 — thumbs 👍🏽, family 👨‍👩‍👧, flags 🇩🇪🇯🇵, ©®™ €£¥",
    "markup": "<div class=\"x\">Hello &amp; <b>bye</b></div> **bold** `code` # Heading",
}


class Verdict(str, Enum):
    IDENTICAL = "identical"
    COMPATIBLE = "compatible"
    INCOMPATIBLE = "incompatible"

    @property
    def exit_code(self) -> int:
        return 1 if self is Verdict.INCOMPATIBLE else 0


VERDICT_MEANINGS = {
    Verdict.IDENTICAL: "the same tokenizer",
    Verdict.COMPATIBLE: "shared ids mean the same text; speculative decoding is exact",
    Verdict.INCOMPATIBLE: "this draft cannot draft for this target",
}


class Severity(str, Enum):
    BLOCKING = "blocking"  # makes the pair incompatible
    TOLERATED = "tolerated"  # a real difference that speculative decoding handles exactly
    WARNING = "warning"  # worth knowing; does not change the ids either model sees


@dataclass(frozen=True)
class Difference:
    kind: str  # stable identifier, e.g. "token-text", "draft-extra-tokens"
    severity: Severity
    message: str  # one line
    evidence: tuple[str, ...] = ()  # further lines: ids side by side, counts, the sample that differs


@dataclass(frozen=True)
class VocabInfo:
    """The tokenizer of one GGUF file, as its metadata states it."""

    path: Path
    architecture: str | None
    model: str  # tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (byte-level BPE), ...
    pre: str | None  # tokenizer.ggml.pre
    tokens: list[bytes]
    token_types: np.ndarray | None
    scores: np.ndarray | None
    merges: list[bytes] | None
    special_ids: dict[str, int]  # "bos", "eos", "eot", "unknown", "padding", ... -> id
    settings: dict[str, Any]  # other tokenizer.ggml.* scalars: add_bos_token, add_space_prefix, ...
    chat_template: str | None
    tensor_count: int

    @property
    def size(self) -> int:
        return len(self.tokens)

    def setting(self, name: str) -> Any:
        """A setting as llama.cpp applies it: the file's value, else llama.cpp's default for this model."""
        if name in self.settings:
            return self.settings[name]
        return LLAMA_CPP_DEFAULT_SETTINGS.get(self.model, {}).get(name, LLAMA_CPP_DEFAULT_SETTINGS["*"].get(name))

    @property
    def adds_bos(self) -> bool:
        return bool(self.setting("add_bos_token"))

    @property
    def adds_eos(self) -> bool:
        return bool(self.setting("add_eos_token"))


# llama.cpp's defaults when a file leaves a flag out (llama-vocab.cpp), by tokenizer model; "*": any model.
LLAMA_CPP_DEFAULT_SETTINGS: dict[str, dict[str, Any]] = {
    "llama": {"add_bos_token": True, "add_space_prefix": True},
    "*": {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_sep_token": False,
        "add_space_prefix": False,
        "remove_extra_whitespaces": False,
    },
}


@dataclass(frozen=True)
class LlamaCppRule:
    accepts: bool
    reason: str  # why it rejects, or what it would have checked


@dataclass
class VocabReport:
    draft: VocabInfo
    target: VocabInfo
    verdict: Verdict
    differences: list[Difference]
    llama_cpp: LlamaCppRule
    samples_checked: int  # 0 when the sample tokenization was not needed or not possible

    @property
    def reasons(self) -> list[str]:
        """Why the pair is incompatible (empty unless it is)."""
        return [d.message for d in self.differences if d.severity is Severity.BLOCKING]

    @property
    def tolerated(self) -> list[str]:
        return [d.message for d in self.differences if d.severity is Severity.TOLERATED]

    @property
    def warnings(self) -> list[str]:
        return [d.message for d in self.differences if d.severity is Severity.WARNING]

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def llama_cpp_disagrees(self) -> bool:
        return self.llama_cpp.accepts == (self.verdict is Verdict.INCOMPATIBLE)

    def explain(self) -> str:
        """The full human-readable report, plain text."""
        lines = [
            f"draft:  {self.draft.path}  ({_describe(self.draft)})",
            f"target: {self.target.path}  ({_describe(self.target)})",
            f"verdict: {self.verdict.value.upper()} ({VERDICT_MEANINGS[self.verdict]})",
        ]
        headings = {
            Severity.BLOCKING: "incompatible because:",
            Severity.TOLERATED: "tolerated (speculative decoding stays exact):",
            Severity.WARNING: "warnings:",
        }
        for severity, heading in headings.items():
            of_severity = [d for d in self.differences if d.severity is severity]
            if of_severity:
                lines.append(heading)
                for difference in of_severity:
                    lines.append(f"  - {difference.message}")
                    lines.extend(f"      {line}" for line in difference.evidence)
        if self.samples_checked:
            lines.append(f"sample text: {self.samples_checked} samples tokenized by both tokenizers")
        if self.llama_cpp_disagrees:
            decision = "accept" if self.llama_cpp.accepts else "reject"
            lines.append(f"note: llama.cpp's own check would {decision} this pair: {self.llama_cpp.reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report for --json: stable keys, plain JSON types."""

        def side(info: VocabInfo) -> dict[str, Any]:
            return {
                "path": str(info.path),
                "architecture": info.architecture,
                "tokenizer_model": info.model,
                "pre_tokenizer": info.pre,
                "vocab_size": info.size,
                "special_ids": info.special_ids,
                "add_bos": info.adds_bos,
                "add_eos": info.adds_eos,
            }

        return {
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "draft": side(self.draft),
            "target": side(self.target),
            "differences": [
                {"kind": d.kind, "severity": d.severity.value, "message": d.message, "evidence": list(d.evidence)}
                for d in self.differences
            ],
            "samples_checked": self.samples_checked,
            "llama_cpp": {"accepts": self.llama_cpp.accepts, "reason": self.llama_cpp.reason},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)


class SampleTokenizer(Protocol):
    """What the practical test needs from a vocabulary-only model (speccli.llama.tokenizer.Tokenizer fits)."""

    def tokenize(self, text: bytes, add_special: bool = False, parse_special: bool = False) -> list[int]: ...

    def close(self) -> None: ...


TokenizerLoader = Callable[[Path], SampleTokenizer]


# --- public entry points -------------------------------------------------------------------------


def check_pair(draft: str | Path, target: str | Path, *, load_tokenizer: TokenizerLoader | None = None) -> VocabReport:
    """Compare the draft's vocabulary with the target's. Reads metadata; loads the two tokenizers (no
    weights) only when their metadata differs, for the practical sample test.

    `load_tokenizer` defaults to speccli.llama.tokenizer.load_vocab_only. Raises UnreadableFileError (exit code 2)
    for a file that is missing, unreadable, not GGUF, truncated or without tokenizer metadata.
    """
    draft_info, target_info = read_vocab(draft), read_vocab(target)
    differences = compare_metadata(draft_info, target_info)
    identical = _same_tokenizer_fields(draft_info, target_info)
    samples_checked = 0
    # llama.cpp builds its tokenizer from the tokenizer metadata and the architecture (a few
    # architectures change defaults), so with both equal the sample could not tokenize differently.
    if not (identical and draft_info.architecture == target_info.architecture):
        if load_tokenizer is None:
            from speccli.llama.tokenizer import load_vocab_only

            load_tokenizer = load_vocab_only
        framing_kinds = {"add-bos-token", "add-eos-token", "special-bos", "special-eos"}
        sample_differences, samples_checked = compare_sample_tokenization(
            draft_info, target_info, load_tokenizer, metadata_already_blocks=_blocks(differences),
            framing_already_blocks=_blocks(d for d in differences if d.kind in framing_kinds),
        )
        differences += sample_differences
    if _blocks(differences):
        verdict = Verdict.INCOMPATIBLE
    elif identical:
        verdict = Verdict.IDENTICAL
    else:
        verdict = Verdict.COMPATIBLE
    return VocabReport(
        draft_info, target_info, verdict, differences, llama_cpp_rule(draft_info, target_info), samples_checked
    )


def ensure_compatible(
    draft: str | Path, target: str | Path, *, load_tokenizer: TokenizerLoader | None = None
) -> VocabReport:
    """check_pair, raising SpeccliError with the first reason when the pair is incompatible."""
    report = check_pair(draft, target, load_tokenizer=load_tokenizer)
    if report.verdict is Verdict.INCOMPATIBLE:
        more = len(report.reasons) - 1
        also = f" (and {more} more)" if more else ""
        raise SpeccliError(
            f"draft {report.draft.path.name} cannot draft for target {report.target.path.name}: "
            f"{report.reasons[0]}{also}; run `speccli check-vocab {report.draft.path} {report.target.path}` for details"
        )
    return report


def read_vocab(path: str | Path) -> VocabInfo:
    """The tokenizer metadata of a GGUF file. Raises UnreadableFileError naming the file."""
    path = Path(path)
    metadata, tensor_count = read_gguf_metadata(
        path, wanted=lambda key: key.startswith("tokenizer.") or key == "general.architecture"
    )
    model = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(model, str) or not isinstance(tokens, list):
        raise UnreadableFileError(f"{path}: GGUF file without tokenizer metadata (no tokenizer.ggml.model/tokens)")
    special_ids, settings = {}, {}
    for key, value in metadata.items():
        name = key.removeprefix("tokenizer.ggml.")
        if name == key or name in ("model", "pre", "tokens", "token_type", "scores", "merges"):
            continue
        if name.endswith("_token_id") and isinstance(value, int):
            special_ids[name.removesuffix("_token_id")] = value
        elif not isinstance(value, (list, np.ndarray)):
            settings[name] = value
    return VocabInfo(
        path=path,
        architecture=metadata.get("general.architecture"),
        model=model,
        pre=metadata.get("tokenizer.ggml.pre"),
        tokens=tokens,
        token_types=_as_array(metadata.get("tokenizer.ggml.token_type")),
        scores=_as_array(metadata.get("tokenizer.ggml.scores")),
        merges=metadata.get("tokenizer.ggml.merges"),
        special_ids=special_ids,
        settings=settings,
        chat_template=metadata.get("tokenizer.chat_template"),
        tensor_count=tensor_count,
    )


# --- comparison --------------------------------------------------------------------------------


def compare_metadata(draft: VocabInfo, target: VocabInfo) -> list[Difference]:
    """Every difference the two files' tokenizer metadata shows, most fundamental first."""
    differences: list[Difference] = []
    if draft.model != target.model:
        differences.append(Difference(
            "tokenizer-model", Severity.BLOCKING,
            f"tokenizer model differs: draft {draft.model!r}, target {target.model!r}",
        ))
    # llama.cpp reads a missing pre-tokenizer as "default".
    if (draft.pre or "default") != (target.pre or "default"):
        differences.append(Difference(
            "pre-tokenizer", Severity.BLOCKING,
            f"pre-tokenizer differs: draft {draft.pre!r}, target {target.pre!r} (text splits into words differently)",
        ))
    if (draft.merges or []) != (target.merges or []):
        differences.append(_merges_difference(draft.merges or [], target.merges or []))
    differences += _size_differences(draft, target)
    differences += _token_differences(draft, target)
    differences += _framing_differences(draft, target)
    differences += _setting_differences(draft, target)
    if draft.chat_template != target.chat_template:
        differences.append(Difference(
            "chat-template", Severity.WARNING,
            "chat templates differ (speccli formats prompts with the target's; token ids are unaffected)",
        ))
    return differences


def compare_sample_tokenization(
    draft: VocabInfo,
    target: VocabInfo,
    load_tokenizer: TokenizerLoader,
    *,
    metadata_already_blocks: bool,
    framing_already_blocks: bool = False,
    samples: dict[str, str] = SAMPLE_TEXTS,
) -> tuple[list[Difference], int]:
    """Tokenize the sample texts with both real tokenizers; returns (differences, samples checked).

    Each text is tokenized as content (no special tokens) and as a prompt (with the BOS/EOS that
    llama.cpp adds by its own rules, defaults included). The second catches a framing difference
    that the metadata alone cannot settle; it is not reported again when the metadata already did.

    A tokenizer llama.cpp cannot load is a file problem (UnreadableFileError) unless the metadata has
    already shown the pair to be incompatible, in which case it is only noted.
    """
    tokenizers: list[SampleTokenizer] = []
    try:
        for info in (draft, target):
            try:
                tokenizers.append(load_tokenizer(info.path))
            except SpeccliError as error:
                if not metadata_already_blocks:
                    raise UnreadableFileError(f"{info.path}: llama.cpp cannot load its tokenizer ({error})") from None
                return [Difference(
                    "sample-not-run", Severity.WARNING, f"sample text not tokenized: {error}",
                )], 0
        draft_tokenizer, target_tokenizer = tokenizers
        differing = []
        framed_differently = []
        for name, text in samples.items():
            data = text.encode("utf-8")
            draft_ids = draft_tokenizer.tokenize(data, add_special=False, parse_special=False)
            target_ids = target_tokenizer.tokenize(data, add_special=False, parse_special=False)
            if draft_ids != target_ids:
                differing.append((name, draft_ids, target_ids))
            elif draft_tokenizer.tokenize(data, add_special=True) != target_tokenizer.tokenize(data, add_special=True):
                framed_differently.append(name)
    finally:
        for tokenizer in tokenizers:
            tokenizer.close()
    if not differing:
        if framed_differently and not framing_already_blocks:
            return [Difference(
                "sample-framing", Severity.BLOCKING,
                "llama.cpp adds different special tokens (BOS/EOS) to the same prompt for the two models",
                (f"{len(framed_differently)} of {len(samples)} samples: {', '.join(framed_differently)}",),
            )], len(samples)
        return [], len(samples)
    evidence = [f"{len(differing)} of {len(samples)} samples differ: {', '.join(name for name, _, _ in differing)}"]
    for name, draft_ids, target_ids in differing[:3]:
        first = _first_mismatch(draft_ids, target_ids)
        if first is None:  # one is a prefix of the other
            first = min(len(draft_ids), len(target_ids))
        evidence.append(f"{name}: {samples[name][:60]!r}")
        evidence.append(f"  draft  ({len(draft_ids)} ids) from position {first}: {draft_ids[first:first + 8]}")
        evidence.append(f"  target ({len(target_ids)} ids) from position {first}: {target_ids[first:first + 8]}")
    return [Difference(
        "sample-tokenization", Severity.BLOCKING,
        "the two tokenizers turn the same text into different ids", tuple(evidence),
    )], len(samples)


def llama_cpp_rule(draft: VocabInfo, target: VocabInfo) -> LlamaCppRule:
    """What llama.cpp's common_speculative_are_compatible would decide for these two vocabularies."""
    if draft.model != target.model:
        return LlamaCppRule(False, "vocab types differ")
    framing = (("bos", draft.adds_bos, target.adds_bos), ("eos", draft.adds_eos, target.adds_eos))
    for token, draft_adds, target_adds in framing:
        if draft_adds != target_adds or (target_adds and draft.special_ids.get(token) != target.special_ids.get(token)):
            return LlamaCppRule(False, f"{token.upper()} tokens differ")
    if abs(draft.size - target.size) > LLAMA_CPP_MAX_SIZE_DIFFERENCE:
        return LlamaCppRule(False, f"vocab sizes differ by more than {LLAMA_CPP_MAX_SIZE_DIFFERENCE}")
    shared = min(draft.size, target.size)
    checked = slice(LLAMA_CPP_CHECK_START_ID, shared)
    mismatch = _first_mismatch(draft.tokens[checked], target.tokens[checked])
    if mismatch is not None:
        return LlamaCppRule(False, f"token {mismatch + LLAMA_CPP_CHECK_START_ID} differs")
    return LlamaCppRule(
        True,
        f"same vocab type, same BOS/EOS handling, sizes within {LLAMA_CPP_MAX_SIZE_DIFFERENCE}, "
        f"equal token text from id {LLAMA_CPP_CHECK_START_ID} on",
    )


def _size_differences(draft: VocabInfo, target: VocabInfo) -> list[Difference]:
    if draft.size > target.size:
        return [Difference(
            "draft-extra-tokens", Severity.BLOCKING,
            f"the draft has {draft.size - target.size} ids the target lacks ({target.size}..{draft.size - 1}): "
            "the draft can propose them and the target cannot verify them",
            (f"draft {draft.size} tokens, target {target.size}; first extra: {_show(draft.tokens[target.size])}",),
        )]
    if target.size > draft.size:
        return [Difference(
            "target-extra-tokens", Severity.TOLERATED,
            f"the target has {target.size - draft.size} ids the draft lacks ({draft.size}..{target.size - 1}): "
            "the draft never proposes them; speccli gives them draft probability 0, and where the target "
            "emits one, the draft is shown token 0 instead (it changes proposals, never the output)",
            (f"draft {draft.size} tokens, target {target.size}; first extra: {_show(target.tokens[draft.size])}",),
        )]
    return []


def _token_differences(draft: VocabInfo, target: VocabInfo) -> list[Difference]:
    shared = min(draft.size, target.size)
    differences = []
    if draft.tokens[:shared] != target.tokens[:shared]:
        draft_text = np.array(draft.tokens[:shared], dtype=object)
        target_text = np.array(target.tokens[:shared], dtype=object)
        mismatched = np.flatnonzero(draft_text != target_text)
        evidence = [f"{len(mismatched)} of {shared} shared ids differ (id: draft | target):"]
        evidence += [
            f"{i}: {_show(draft.tokens[i])} | {_show(target.tokens[i])}" for i in mismatched[:SHOWN_MISMATCHES]
        ]
        shift = _detect_shift(draft_text, target_text, mismatched)
        if shift:
            evidence.append(f"the ids look shifted: draft id i{shift:+d} holds the text of target id i")
        differences.append(Difference(
            "token-text", Severity.BLOCKING,
            f"token text differs at {len(mismatched)} shared ids, first at id {mismatched[0]}",
            tuple(evidence),
        ))
    if draft.token_types is not None and target.token_types is not None:
        type_mismatched = np.flatnonzero(draft.token_types[:shared] != target.token_types[:shared])
        if len(type_mismatched):
            differences.append(Difference(
                "token-type", Severity.WARNING,
                f"token types differ at {len(type_mismatched)} shared ids, first at id {type_mismatched[0]}",
                tuple(
                    f"{i}: {_show(target.tokens[i])} "
                    f"draft type {int(draft.token_types[i])} | target type {int(target.token_types[i])}"
                    for i in type_mismatched[:SHOWN_MISMATCHES]
                ),
            ))
    if draft.scores is not None and target.scores is not None:
        score_mismatched = np.flatnonzero(draft.scores[:shared] != target.scores[:shared])
        if len(score_mismatched):
            differences.append(Difference(
                "token-score", Severity.WARNING,
                f"token scores differ at {len(score_mismatched)} shared ids "
                "(merge priorities; the sample test decides)",
            ))
    return differences


def _framing_differences(draft: VocabInfo, target: VocabInfo) -> list[Difference]:
    """Special-token ids and the add-BOS/EOS flags: how a sequence starts and ends."""
    differences = []
    for flag, token in (("add_bos_token", "bos"), ("add_eos_token", "eos")):
        draft_adds, target_adds = bool(draft.setting(flag)), bool(target.setting(flag))
        if draft_adds != target_adds:
            # Both files state the flag: decided here. One leaves it to llama.cpp's default, whose
            # rules depend on more than this table knows: the sample test, which tokenizes with the
            # special tokens added by llama.cpp itself, decides instead.
            both_explicit = flag in draft.settings and flag in target.settings
            differences.append(Difference(
                f"{flag.replace('_', '-')}", Severity.BLOCKING if both_explicit else Severity.WARNING,
                f"{token.upper()} is added to prompts by the {'draft' if draft_adds else 'target'} only "
                f"({flag}: draft {draft_adds}, target {target_adds})"
                + ("" if both_explicit else "; one file leaves it to llama.cpp's default, so the sample test decides"),
            ))
    for name in sorted(set(draft.special_ids) | set(target.special_ids)):
        draft_id, target_id = draft.special_ids.get(name), target.special_ids.get(name)
        if draft_id == target_id:
            continue
        added = (name == "bos" and (draft.adds_bos or target.adds_bos)) or (
            name == "eos" and (draft.adds_eos or target.adds_eos))
        why = "it starts every prompt" if name == "bos" else "it ends every prompt" if name == "eos" else ""
        differences.append(Difference(
            f"special-{name}", Severity.BLOCKING if added else Severity.WARNING,
            f"{name.upper()} id differs: draft {_show_id(draft, draft_id)}, target {_show_id(target, target_id)}"
            + (f" ({why})" if added else ""),
        ))
    return differences


def _setting_differences(draft: VocabInfo, target: VocabInfo) -> list[Difference]:
    """Other tokenizer.ggml.* flags (add_space_prefix, remove_extra_whitespaces, ...) change tokenization."""
    differences = []
    for name in sorted((set(draft.settings) | set(target.settings)) - {"add_bos_token", "add_eos_token"}):
        draft_value, target_value = draft.setting(name), target.setting(name)
        if draft_value != target_value:
            differences.append(Difference(
                f"setting-{name}", Severity.BLOCKING,
                f"tokenizer setting {name} differs: draft {draft_value!r}, target {target_value!r}",
            ))
    return differences


def _merges_difference(draft_merges: list[bytes], target_merges: list[bytes]) -> Difference:
    first = _first_mismatch(draft_merges, target_merges)
    if first is None:  # one list is a prefix of the other
        first = min(len(draft_merges), len(target_merges))
    def rule(merges: list[bytes]) -> str:
        return _show(merges[first]) if first < len(merges) else "(none)"

    return Difference(
        "merges", Severity.BLOCKING,
        f"BPE merge rules differ: draft {len(draft_merges)}, target {len(target_merges)} rules",
        (f"first difference at rule {first}: draft {rule(draft_merges)} | target {rule(target_merges)}",),
    )


def _same_tokenizer_fields(draft: VocabInfo, target: VocabInfo) -> bool:
    """True when every tokenizer field is equal (the chat template aside)."""
    def arrays_equal(a: np.ndarray | None, b: np.ndarray | None) -> bool:
        return (a is None) == (b is None) and (a is None or np.array_equal(a, b))

    return (
        draft.tokens == target.tokens
        and arrays_equal(draft.token_types, target.token_types)
        and arrays_equal(draft.scores, target.scores)
        and draft.merges == target.merges
        and draft.special_ids == target.special_ids
        and draft.settings == target.settings
        and draft.model == target.model
        and draft.pre == target.pre
    )


def _blocks(differences: Iterable[Difference]) -> bool:
    return any(d.severity is Severity.BLOCKING for d in differences)


def _detect_shift(draft_text: np.ndarray, target_text: np.ndarray, mismatched: np.ndarray) -> int:
    """An offset k with draft[i + k] == target[i] for nearly all mismatching ids i, else 0."""
    probe = mismatched[:200]
    for shift in (1, -1, 2, -2):
        index = probe + shift
        inside = (index >= 0) & (index < len(draft_text))
        if inside.sum() >= 3 and np.mean(draft_text[index[inside]] == target_text[probe[inside]]) > 0.9:
            return shift
    return 0


def _first_mismatch(a: list, b: list) -> int | None:
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def _show(token: bytes) -> str:
    """A token's text, quoted, with control and invalid bytes escaped."""
    return repr(token.decode("utf-8", errors="backslashreplace"))


def _show_id(info: VocabInfo, token_id: int | None) -> str:
    if token_id is None:
        return "not set"
    text = _show(info.tokens[token_id]) if 0 <= token_id < info.size else "out of range"
    return f"{token_id} {text}"


def _describe(info: VocabInfo) -> str:
    pre = f"/{info.pre}" if info.pre else ""
    weights = "vocabulary only" if info.tensor_count == 0 else info.architecture or "unknown architecture"
    return f"{info.model}{pre} tokenizer, {info.size} tokens, {weights}"


def _as_array(value: Any) -> np.ndarray | None:
    return value if isinstance(value, np.ndarray) else None
