"""The tokens two vocabularies share: ids whose text is the same in both (read from metadata), and a
draft's distribution carried over to the target's ids of those tokens (`on_shared_tokens`).

A token's text is what it stands for once decoded: SentencePiece's "▁" is a space, a byte-level BPE's
symbols map back to their bytes (GPT-2's table), byte-fallback tokens (<0x41>) and special tokens are
no text. The share says how much of a draft's vocabulary a target could take token for token; pairs
of one family share nearly all, others part (vLLM reports 70-80% for unrelated families).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from speccli.core.sampling import Distribution
from speccli.vocab.info import VocabInfo

# A draft of another vocabulary draws among the tokens it shares with the target (TLI, with q) where at
# least this share of its text tokens are the target's too, else it drafts text (measured on the two
# cross-family pairs here: docs/results.md, "Drafts of another vocabulary").
TLI_MIN_SHARE = 0.5
_NORMAL, _USER_DEFINED = 1, 4  # llama.cpp's token types that stand for text (NORMAL, USER_DEFINED)
_SPM_SPACE = "▁".encode()


@lru_cache(maxsize=1)
def _byte_symbols() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest are shifted past 255."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    symbols, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[chr(byte)] = byte
        else:
            symbols[chr(256 + shifted)] = byte
            shifted += 1
    return symbols


def token_texts(info: VocabInfo) -> dict[bytes, int]:
    """Text -> id for every token of `info` that stands for text (the first id where two spell one text)."""
    texts: dict[bytes, int] = {}
    types = info.token_types if info.token_types is not None else np.full(info.size, _NORMAL)
    symbols = _byte_symbols() if info.model == "gpt2" else None
    for token_id, (raw, kind) in enumerate(zip(info.tokens, types)):
        if kind not in (_NORMAL, _USER_DEFINED):
            continue
        if symbols is not None:
            spelled = raw.decode("utf-8", errors="replace")
            if not all(character in symbols for character in spelled):
                continue
            text = bytes(symbols[character] for character in spelled)
        elif info.model == "llama":
            text = raw.replace(_SPM_SPACE, b" ")
        else:
            text = raw
        texts.setdefault(text, token_id)
    return texts


@dataclass(frozen=True)
class SharedVocabulary:
    draft_ids: np.ndarray  # ids in the draft's vocabulary ...
    target_ids: np.ndarray  # ... and the target's ids of the same text
    draft_text_tokens: int  # the draft's tokens that stand for text

    @property
    def mode(self) -> str:
        """How a draft of another vocabulary drafts for this target (speccli/drafting/translated.py)."""
        return "shared tokens" if self.share >= TLI_MIN_SHARE else "text"

    @property
    def share(self) -> float:
        """Of the draft's text tokens, the part the target's vocabulary also has."""
        return len(self.draft_ids) / self.draft_text_tokens if self.draft_text_tokens else 0.0


def shared_vocabulary(draft: VocabInfo, target: VocabInfo) -> SharedVocabulary:
    draft_texts, target_texts = token_texts(draft), token_texts(target)
    pairs = [(draft_id, target_texts[text]) for text, draft_id in draft_texts.items() if text in target_texts]
    ids = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return SharedVocabulary(ids[:, 0], ids[:, 1], len(draft_texts))


class SharedTokens:
    """The tokens both vocabularies spell alike (a `SharedVocabulary`), looked up either way."""

    def __init__(self, shared: SharedVocabulary, target_vocab: int) -> None:
        by_target = np.argsort(shared.target_ids, kind="stable")
        self.draft_ids, self.target_ids = shared.draft_ids[by_target], shared.target_ids[by_target]
        self.target_of_draft = np.full(int(shared.draft_ids.max(initial=-1)) + 1, -1, dtype=np.int64)
        self.target_of_draft[shared.draft_ids] = shared.target_ids
        self.draft_of_target = dict(zip(shared.target_ids.tolist(), shared.draft_ids.tolist()))
        self.target_vocab = target_vocab


def on_shared_tokens(q: Distribution, shared: SharedTokens) -> Distribution | None:
    """The draft's distribution restricted to the shared tokens and renormalised, each token's probability
    at the target's id of the same text; None where the shared tokens have no mass."""
    if q.ids is None:
        target_ids, weights = shared.target_ids, q.weights[shared.draft_ids]
    else:
        mapped = shared.target_of_draft[np.minimum(q.ids, len(shared.target_of_draft) - 1)]
        keep = (mapped >= 0) & (q.ids < len(shared.target_of_draft))
        order = np.argsort(mapped[keep])
        target_ids, weights = mapped[keep][order], q.weights[keep][order]
    mass = float(weights.sum(dtype=np.float64))
    return Distribution(target_ids, weights, shared.target_vocab, mass) if mass > 0 else None
