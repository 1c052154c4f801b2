"""check-vocab's practical test: sample texts of varied kinds tokenized by both real tokenizers (no
weights loaded), as content and as a prompt, and the differences that shows."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from speccli.errors import SpeccliError, UnreadableFileError
from speccli.util.sequences import common_prefix_length
from speccli.vocab.info import VocabInfo
from speccli.vocab.report import Difference, Severity

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


class SampleTokenizer(Protocol):
    """What the practical test needs from a vocabulary-only model (speccli.llama.tokenizer.Tokenizer fits)."""

    def tokenize(self, text: bytes, add_special: bool = False, parse_special: bool = False) -> list[int]: ...

    def close(self) -> None: ...


TokenizerLoader = Callable[[Path], SampleTokenizer]


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
        first = common_prefix_length(draft_ids, target_ids)  # where they part, or where the shorter ends
        evidence.append(f"{name}: {samples[name][:60]!r}")
        evidence.append(f"  draft  ({len(draft_ids)} ids) from position {first}: {draft_ids[first:first + 8]}")
        evidence.append(f"  target ({len(target_ids)} ids) from position {first}: {target_ids[first:first + 8]}")
    return [Difference(
        "sample-tokenization", Severity.BLOCKING,
        "the two tokenizers turn the same text into different ids", tuple(evidence),
    )], len(samples)
