"""A check-vocab verdict and the differences behind it, as text (`explain`) and JSON."""
from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Any

from speccli.util.format import json_safe
from speccli.vocab.info import VocabInfo
from speccli.vocab.shared import SharedVocabulary, shared_vocabulary


class VocabVerdict(str, Enum):
    """Whether a draft's vocabulary can draft for a target's (check-vocab's answer)."""

    IDENTICAL = "identical"
    COMPATIBLE = "compatible"
    INCOMPATIBLE = "incompatible"

    @property
    def exit_code(self) -> int:
        return 1 if self is VocabVerdict.INCOMPATIBLE else 0


VERDICT_MEANINGS = {
    VocabVerdict.IDENTICAL: "the same tokenizer",
    VocabVerdict.COMPATIBLE: "shared ids mean the same text; speculative decoding is exact",
    VocabVerdict.INCOMPATIBLE: "the draft's ids are not the target's",
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
class LlamaCppRule:
    accepts: bool
    reason: str  # why it rejects, or what it would have checked


@dataclass
class VocabReport:
    draft: VocabInfo
    target: VocabInfo
    verdict: VocabVerdict
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
        return self.llama_cpp.accepts == (self.verdict is VocabVerdict.INCOMPATIBLE)

    @cached_property
    def shared(self) -> SharedVocabulary:
        """The tokens both vocabularies spell alike (a loop over every token: computed once)."""
        return shared_vocabulary(self.draft, self.target)

    @property
    def translation(self) -> dict[str, Any] | None:
        """How the pair runs where the ids differ (speccli/drafting/translated.py); None where the draft
        proposes its own ids."""
        if self.verdict is not VocabVerdict.INCOMPATIBLE:
            return None
        return {"mode": self.shared.mode, "shared_share": self.shared.share}

    def explain(self) -> str:
        """The full human-readable report, plain text."""
        lines = [
            f"draft:  {self.draft.path}  ({_describe(self.draft)})",
            f"target: {self.target.path}  ({_describe(self.target)})",
            f"verdict: {self.verdict.value.upper()} ({VERDICT_MEANINGS[self.verdict]})",
        ]
        if self.translation is not None:
            how = ("drawn among the tokens both spell alike, with their probabilities, when sampling; its text when greedy"
                   if self.translation["mode"] == "shared tokens" else "the draft's text, re-tokenized by the target")
            lines.append(f"runs: with translated drafts ({how}); {self.translation['shared_share']:.0%} of the draft's "
                         "text tokens are tokens of the target's vocabulary too")
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
            "translation": self.translation,
            "llama_cpp": {"accepts": self.llama_cpp.accepts, "reason": self.llama_cpp.reason},
        }

    def to_json(self) -> str:
        return json.dumps(json_safe(self.to_dict()), indent=2, ensure_ascii=False)


def _describe(info: VocabInfo) -> str:
    pre = f"/{info.pre}" if info.pre else ""
    weights = "vocabulary only" if info.tensor_count == 0 else info.architecture or "unknown architecture"
    return f"{info.model}{pre} tokenizer, {info.size} tokens, {weights}"
