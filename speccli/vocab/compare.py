"""The two files' tokenizer metadata compared for a check-vocab verdict: each difference with its
severity, and llama.cpp's own compatibility rule. The practical test, a sample tokenized by both, is
`speccli.vocab.sample_tokenization`."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from speccli.util.format import counted
from speccli.util.sequences import common_prefix_length
from speccli.vocab.info import VocabInfo
from speccli.vocab.report import Difference, LlamaCppRule, Severity

LLAMA_CPP_MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE in llama.cpp common/speculative.cpp
LLAMA_CPP_CHECK_START_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID: llama.cpp ignores text of ids below this
SHOWN_MISMATCHES = 5


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
    differences += _unstated_differences(draft, target)
    if draft.chat_template != target.chat_template:
        differences.append(Difference(
            "chat-template", Severity.WARNING,
            "chat templates differ (speccli formats prompts with the target's; token ids are unaffected)",
        ))
    if any(difference.severity is Severity.BLOCKING for difference in differences):
        # The drafts are then translated: how a draft of the same vocabulary treats the target's extra
        # ids does not apply (check-vocab had said it, under "tolerated", of a Qwen draft for Gemma).
        differences = [difference for difference in differences if difference.kind != "target-extra-tokens"]
    return differences


def _unstated_differences(draft: VocabInfo, target: VocabInfo) -> list[Difference]:
    """Fields one file states and the other leaves out (a pre-tokenizer or setting whose llama.cpp
    default is the stated value; token types or scores, whose defaults may or may not agree): not
    IDENTICAL, so named, as warnings. The sample tokenization, which runs whenever the files differ,
    decides whether they change how text tokenizes."""
    differences = []

    def stated_by(draft_has: bool) -> str:
        return f"stated in the {'draft' if draft_has else 'target'} file only"

    if draft.pre != target.pre and (draft.pre or "default") == (target.pre or "default"):
        differences.append(Difference(
            "pre-tokenizer-unstated", Severity.WARNING,
            f"pre-tokenizer {stated_by(draft.pre is not None)} ('default', which llama.cpp also reads for a missing one)",
        ))
    for name, draft_array, target_array in (("token types", draft.token_types, target.token_types),
                                            ("scores", draft.scores, target.scores)):
        if (draft_array is None) != (target_array is None):
            differences.append(Difference(
                f"{name.replace(' ', '-')}-unstated", Severity.WARNING,
                f"{name} {stated_by(draft_array is not None)} (llama.cpp's defaults stand in for the other's)",
            ))
    for name in sorted(set(draft.settings) ^ set(target.settings)):
        if draft.setting(name) == target.setting(name):
            differences.append(Difference(
                f"setting-{name}-unstated", Severity.WARNING,
                f"tokenizer setting {name} {stated_by(name in draft.settings)}, as {draft.setting(name)!r}: "
                "llama.cpp's default for the other is the same",
            ))
    return differences


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
    draft_checked, target_checked = draft.tokens[checked], target.tokens[checked]
    if draft_checked != target_checked:
        mismatch = common_prefix_length(draft_checked, target_checked)
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
            f"token text differs at {counted(len(mismatched), 'shared id')}, first at id {mismatched[0]}",
            tuple(evidence),
        ))
    if draft.token_types is not None and target.token_types is not None:
        type_mismatched = np.flatnonzero(draft.token_types[:shared] != target.token_types[:shared])
        if len(type_mismatched):
            differences.append(Difference(
                "token-type", Severity.WARNING,
                f"token types differ at {counted(len(type_mismatched), 'shared id')}, first at id {type_mismatched[0]}",
                tuple(
                    f"{i}: draft {_show(draft.tokens[i])} type {int(draft.token_types[i])} | "
                    f"target {_show(target.tokens[i])} type {int(target.token_types[i])}"
                    for i in type_mismatched[:SHOWN_MISMATCHES]
                ),
            ))
    if draft.scores is not None and target.scores is not None:
        score_mismatched = np.flatnonzero(draft.scores[:shared] != target.scores[:shared])
        if len(score_mismatched):
            differences.append(Difference(
                "token-score", Severity.WARNING,
                f"token scores differ at {counted(len(score_mismatched), 'shared id')} "
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
    first = common_prefix_length(draft_merges, target_merges)  # where they part, or where the shorter ends
    def rule(merges: list[bytes]) -> str:
        return _show(merges[first]) if first < len(merges) else "(none)"

    return Difference(
        "merges", Severity.BLOCKING,
        f"BPE merge rules differ: draft {len(draft_merges)}, target {len(target_merges)} rules",
        (f"first difference at rule {first}: draft {rule(draft_merges)} | target {rule(target_merges)}",),
    )


def same_tokenizer_fields(draft: VocabInfo, target: VocabInfo) -> bool:
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


def blocks(differences: Iterable[Difference]) -> bool:
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


def _show(token: bytes) -> str:
    """A token's text, quoted, with control and invalid bytes escaped."""
    return repr(token.decode("utf-8", errors="backslashreplace"))


def _show_id(info: VocabInfo, token_id: int | None) -> str:
    if token_id is None:
        return "not set"
    text = _show(info.tokens[token_id]) if 0 <= token_id < info.size else "out of range"
    return f"{token_id} {text}"
