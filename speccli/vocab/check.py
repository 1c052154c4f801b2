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

from functools import lru_cache
from pathlib import Path

from speccli.llama.tokenizer import load_vocab_only
from speccli.vocab.compare import blocks, compare_metadata, llama_cpp_rule, same_tokenizer_fields
from speccli.vocab.info import read_vocab
from speccli.vocab.report import VocabVerdict, VocabReport
from speccli.vocab.sample_tokenization import TokenizerLoader, compare_sample_tokenization
from speccli.vocab.shared import SharedVocabulary


def check_pair(draft: str | Path, target: str | Path, *, load_tokenizer: TokenizerLoader | None = None) -> VocabReport:
    """Compare the draft's vocabulary with the target's. Reads metadata; loads the two tokenizers (no
    weights) only when their metadata differs, for the practical sample test.

    `load_tokenizer` defaults to speccli.llama.tokenizer.load_vocab_only. Raises UnreadableFileError (exit code 2)
    for a file that is missing, unreadable, not GGUF, truncated or without tokenizer metadata.
    """
    draft_info, target_info = read_vocab(draft), read_vocab(target)
    differences = compare_metadata(draft_info, target_info)
    identical = same_tokenizer_fields(draft_info, target_info)
    samples_checked = 0
    # llama.cpp builds its tokenizer from the tokenizer metadata and the architecture (a few
    # architectures change defaults), so with both equal the sample could not tokenize differently.
    if not (identical and draft_info.architecture == target_info.architecture):
        load_tokenizer = load_tokenizer or load_vocab_only
        framing_kinds = {"add-bos-token", "add-eos-token", "special-bos", "special-eos"}
        sample_differences, samples_checked = compare_sample_tokenization(
            draft_info, target_info, load_tokenizer, metadata_already_blocks=blocks(differences),
            framing_already_blocks=blocks(d for d in differences if d.kind in framing_kinds),
        )
        differences += sample_differences
    if blocks(differences):
        verdict = VocabVerdict.INCOMPATIBLE
    elif identical:
        verdict = VocabVerdict.IDENTICAL
    else:
        verdict = VocabVerdict.COMPATIBLE
    return VocabReport(
        draft_info, target_info, verdict, differences, llama_cpp_rule(draft_info, target_info), samples_checked
    )


@lru_cache(maxsize=16)
def checked_pair(draft: Path, target: Path) -> VocabReport:
    """check_pair, once per pair and process: resolving a pair, making its drafter and naming how it
    drafts all ask (a check loads both tokenizers where their metadata differs)."""
    return check_pair(draft, target)


def vocabularies_differ(draft: Path, target: Path) -> bool:
    """Whether the draft's ids cannot be proposed as the target's."""
    return checked_pair(draft, target).verdict is VocabVerdict.INCOMPATIBLE


def shared_tokens(draft: Path, target: Path) -> SharedVocabulary | None:
    """The shared tokens a draft of another vocabulary draws among, where they are enough (TLI_MIN_SHARE)."""
    shared = checked_pair(draft, target).shared
    return shared if shared.mode == "shared tokens" else None


def draft_proposes(draft: Path | None, target: Path) -> str | None:
    """What a draft model proposes to this target: "ids" (its vocabulary is the target's), "shared tokens"
    or "text" (another vocabulary: speccli/drafting/translated.py); None without a draft model."""
    if draft is None:
        return None
    if not vocabularies_differ(draft, target):
        return "ids"
    return "text" if shared_tokens(draft, target) is None else "shared tokens"
