"""The tiny GGUF writer produces files real llama.cpp loads, tokenizes faithfully and runs as promised."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from gguf import GGUFReader

from tests.tiny_gguf import (
    TinyConfig,
    gpt2_vocabulary,
    spm_vocabulary,
    write_related_pair,
    write_tiny_gguf,
)

ROUND_TRIP_TEXTS = {
    "ascii": "The quick brown fox jumps over the lazy dog.",
    "multi-line": "line one\nline two\n\nline four\n",
    "spaces": "  two leading, three   inside, a tab\tand trailing  ",
    "lone space": " ",
    "non-ascii": "héllo wörld — 日本語 🎉 Привет",
    "punctuation": '{"a": [1, 2.5, -3e4], "b": null} <tag/> ~!@#$%^&*()',
}
AGREEMENT_PROMPTS = (b"the quick brown fox", b"once upon a time\n")


def load(path: Path, **kwargs) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False, **kwargs)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def greedy_continuation(model: llama_cpp.Llama, prompt: list[int], steps: int) -> list[int]:
    model.reset()
    model.eval(prompt)
    continuation = []
    for _ in range(steps):
        token = int(np.argmax(model.scores[model.n_tokens - 1]))
        continuation.append(token)
        model.eval([token])
    return continuation


def next_token_logits(model: llama_cpp.Llama, tokens: list[int]) -> np.ndarray:
    """Logits at every position of `tokens` in one pass (row i predicts token i + 1)."""
    model.reset()
    model.eval(tokens)
    return np.array(model.scores[: len(tokens)])


def greedy_agreement(target_path: Path, draft_path: Path, steps: int = 24) -> float:
    """How often the draft's argmax equals the target's along the target's own greedy continuation."""
    target, draft = load(target_path, logits_all=True), load(draft_path, logits_all=True)
    agreed = []
    for prompt in AGREEMENT_PROMPTS:
        prompt_ids = target.tokenize(prompt, add_bos=True)
        sequence = prompt_ids + greedy_continuation(target, prompt_ids, steps)
        predicting = slice(len(prompt_ids) - 1, len(sequence) - 1)
        target_choice = next_token_logits(target, sequence)[predicting].argmax(axis=-1)
        draft_choice = next_token_logits(draft, sequence)[predicting].argmax(axis=-1)
        agreed.extend(target_choice == draft_choice)
    return float(np.mean(agreed))


def tensors(path: Path) -> dict[str, np.ndarray]:
    return {tensor.name: np.array(tensor.data) for tensor in GGUFReader(path).tensors}


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS.values(), ids=ROUND_TRIP_TEXTS.keys())
def test_text_round_trips_through_llama_cpp(tiny_model: Path, text: str) -> None:
    model = load(tiny_model)
    data = text.encode("utf-8")
    ids = model.tokenize(data, add_bos=False, special=False)
    assert model.detokenize(ids) == data
    assert all(3 <= token < model.n_vocab() for token in ids)  # no <unk>, no control tokens


def test_non_ascii_uses_byte_fallback_tokens(tiny_model: Path) -> None:
    model = load(tiny_model)
    ids = model.tokenize("é".encode(), add_bos=False, special=False)
    assert ids == [3 + 0xC3, 3 + 0xA9]  # <0xC3><0xA9>: byte tokens start at id 3


def test_words_merge_into_prefix_closed_pieces(tiny_dir: Path) -> None:
    path = write_tiny_gguf(tiny_dir / "v4096.gguf", TinyConfig(vocab_size=4096))
    model = load(path)
    # At 4096 the vocabulary holds every 2-letter piece and "▁" + 3 letters up to "▁dmx".
    ids = model.tokenize(b"hi cat", add_bos=False, special=False)
    assert [model.detokenize([token]) for token in ids] == [b"hi", b" cat"]


@pytest.mark.parametrize("vocab_size", [4096, 32000])
def test_larger_vocabularies_load_with_their_size(tiny_dir: Path, vocab_size: int) -> None:
    path = write_tiny_gguf(tiny_dir / f"size{vocab_size}.gguf", TinyConfig(vocab_size=vocab_size))
    model = load(path)
    assert model.n_vocab() == vocab_size
    text = ROUND_TRIP_TEXTS["non-ascii"].encode()
    assert model.detokenize(model.tokenize(text, add_bos=False)) == text


def test_bos_is_added_by_default(tiny_model: Path) -> None:
    model = load(tiny_model)
    assert model.token_bos() == 1 and model.token_eos() == 2
    assert model.tokenize(b"hi", add_bos=True)[0] == 1


def test_gpt2_vocabulary_loads_and_round_trips(tiny_dir: Path) -> None:
    path = write_tiny_gguf(tiny_dir / "gpt2.gguf", TinyConfig(vocab=gpt2_vocabulary(512)))
    model = load(path)
    for text in ROUND_TRIP_TEXTS.values():
        data = text.encode("utf-8")
        assert model.detokenize(model.tokenize(data, add_bos=False, special=False)) == data


def test_vocab_only_file_has_no_tensors_and_loads_as_vocabulary(tiny_dir: Path) -> None:
    path = write_tiny_gguf(tiny_dir / "vocab-only.gguf", TinyConfig(vocab_only=True))
    assert GGUFReader(path).tensors == []
    vocabulary = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    assert vocabulary.detokenize(vocabulary.tokenize(b"hello there", add_bos=False)) == b"hello there"


def test_metadata_overrides_replace_and_remove_keys(tiny_dir: Path) -> None:
    path = write_tiny_gguf(
        tiny_dir / "override.gguf",
        TinyConfig(metadata={"general.name": "renamed", "tokenizer.ggml.pre": None, "custom.answer": 42}),
    )
    fields = GGUFReader(path).fields
    assert fields["general.name"].contents() == "renamed"
    assert fields["custom.answer"].contents() == 42
    assert "tokenizer.ggml.pre" not in fields


def test_top1_probability_is_neither_uniform_nor_one_hot(tiny_model: Path) -> None:
    model = load(tiny_model, logits_all=True)
    prompt = model.tokenize(b"the quick brown fox", add_bos=True)
    sequence = prompt + greedy_continuation(model, prompt, 32)
    top1 = softmax(next_token_logits(model, sequence)).max(axis=-1)
    assert 0.2 <= np.median(top1) <= 0.6
    assert top1.min() > 2 / model.n_vocab()  # far from uniform everywhere
    assert top1.max() < 0.999  # never one-hot


def test_same_seed_gives_bit_identical_tensors(tiny_dir: Path) -> None:
    first = tensors(write_tiny_gguf(tiny_dir / "seed-a.gguf", TinyConfig(seed=7)))
    again = tensors(write_tiny_gguf(tiny_dir / "seed-b.gguf", TinyConfig(seed=7)))
    other = tensors(write_tiny_gguf(tiny_dir / "seed-c.gguf", TinyConfig(seed=8)))
    assert first.keys() == again.keys() == other.keys()
    assert all(np.array_equal(first[name], again[name]) for name in first)
    assert not np.array_equal(first["token_embd.weight"], other["token_embd.weight"])


def test_related_pair_shares_the_drafts_tensors_bit_for_bit(tiny_pair) -> None:
    target, draft = tensors(tiny_pair.target), tensors(tiny_pair.draft)
    assert {"token_embd.weight", "output.weight", "output_norm.weight", "blk.1.ffn_down.weight"} <= draft.keys()
    assert "blk.2.attn_q.weight" not in draft and "blk.7.ffn_down.weight" in target
    for name, values in draft.items():
        assert np.array_equal(values, target[name]), name


def test_related_pair_scales_only_the_extra_layers_outputs(tiny_dir: Path) -> None:
    eps = 0.05
    target_path, _ = write_related_pair(tiny_dir / "scaled", target_layers=3, draft_layers=1, eps=eps)
    scaled = tensors(target_path)
    unscaled = tensors(write_tiny_gguf(tiny_dir / "unscaled.gguf", TinyConfig(n_layer=3)))
    for name in ("blk.1.attn_output.weight", "blk.2.ffn_down.weight"):
        np.testing.assert_allclose(scaled[name], eps * unscaled[name], rtol=1e-6)
    for name in ("blk.0.attn_output.weight", "blk.1.attn_q.weight", "blk.2.ffn_up.weight"):
        assert np.array_equal(scaled[name], unscaled[name])


def test_pair_with_equal_layers_has_identical_content(tiny_dir: Path) -> None:
    target, draft = write_related_pair(tiny_dir / "same", target_layers=2, draft_layers=2, eps=0.5)
    assert target != draft
    assert target.read_bytes() == draft.read_bytes()


def test_greedy_agreement_falls_as_eps_grows(tiny_dir: Path) -> None:
    agreement = {}
    for eps in (0.0, 0.02, 0.2, 1.0):
        target, draft = write_related_pair(tiny_dir / f"agree-{eps}", target_layers=8, draft_layers=2, eps=eps)
        agreement[eps] = greedy_agreement(target, draft)
    assert agreement[0.0] == 1.0
    assert agreement[0.02] >= 0.8
    assert agreement[0.02] > agreement[0.2] > agreement[1.0]
    assert agreement[1.0] <= 0.3


def test_vocabulary_helpers_make_the_intended_mismatches() -> None:
    base = spm_vocabulary(512)
    assert base.with_token(400, "xyz").tokens[400] == "xyz"
    assert base.padded(3).size == 515 and base.padded(3).tokens[-1] == "<extra_2>"
    shifted = base.shifted()
    assert shifted.size == base.size and shifted.tokens[1:] == base.tokens[:-1] and shifted.bos_id == 2
    with pytest.raises(ValueError):
        replace(base, scores=base.scores[:-1])
