"""Small but real llama-architecture GGUF files for tests, written with gguf's GGUFWriter.

The files load in llama.cpp like any downloaded model, yet write in milliseconds:

* a programmatic SentencePiece-style ("llama") vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte-fallback
  tokens `<0x00>`..`<0xFF>`, `▁` and printable ASCII, then letter pieces in breadth-first order so the
  vocabulary is prefix-closed at any size (llama.cpp's SPM merges only reach a piece whose prefixes are
  all in the vocabulary). Any text round-trips through tokenize -> detokenize; characters outside ASCII
  go through byte fallback.
* deterministic random weights: each tensor is drawn from an RNG seeded by (seed, tensor name), so two
  files with the same seed share bit-identical tensors of the same name and shape.
* a related pair (`write_related_pair`): a draft that is exactly the first layers of the target, with the
  target's extra layers scaled down to small residual perturbations, so greedy agreement is controllable.

Random models emit raw byte tokens whose pieces are not valid UTF-8 one by one: compare detokenized
bytes, not decoded strings.

Measured with llama-cpp-python 0.3.36 on CPU (see tests/test_tiny_gguf.py for the checks that keep these
honest):

* top-1 probability at temperature 1 with the default head_scale (4.0), vocab 512, n_embd 64, 2 layers,
  over 4 prompts + 16 greedy steps each: median 0.37, 10th percentile 0.19, 90th 0.81 (neither uniform
  nor one-hot; head_scale 3.0 gives median 0.24, 5.0 gives 0.50).
* greedy agreement of `write_related_pair(target_layers=8, draft_layers=2)` over 4 prompts x 48 steps,
  measured position by position on the target's own greedy continuation:
  eps 0 -> 1.00, eps 0.02 -> 0.94, eps 0.05 -> 0.89, eps 0.2 -> 0.65, eps 1.0 -> 0.04.
"""
from __future__ import annotations

import shutil
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
from gguf import GGUFValueType, GGUFWriter, LlamaFileType, TokenType

SPACE_PIECE = "\u2581"  # SentencePiece's visible space "▁"
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Vocabulary:
    """Everything tokenizer-related a GGUF file carries; replace fields to make a mismatching vocabulary."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...]
    model: str = "llama"
    pre: str | None = "default"
    merges: tuple[str, ...] = ()  # BPE ("gpt2") vocabularies only
    bos_id: int | None = BOS_ID
    eos_id: int | None = EOS_ID
    unk_id: int | None = UNK_ID
    add_bos: bool | None = True
    add_eos: bool | None = False
    # False keeps round trips exact: llama.cpp would otherwise prepend a space to every tokenized text.
    add_space_prefix: bool | None = False
    chat_template: str | None = None

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.token_types) == len(self.scores):
            raise ValueError("tokens, token_types and scores must have the same length")

    @property
    def size(self) -> int:
        return len(self.tokens)

    def with_token(self, token_id: int, text: str) -> "Vocabulary":
        """The same vocabulary with one token's text changed."""
        tokens = list(self.tokens)
        tokens[token_id] = text
        return replace(self, tokens=tuple(tokens))

    def padded(self, extra: int) -> "Vocabulary":
        """The vocabulary with `extra` unreachable `<extra_N>` tokens appended (as converters pad embeddings)."""
        return replace(
            self,
            tokens=self.tokens + tuple(f"<extra_{i}>" for i in range(extra)),
            token_types=self.token_types + (int(TokenType.NORMAL),) * extra,
            scores=self.scores + (0.0,) * extra,
        )

    def shifted(self) -> "Vocabulary":
        """Every id moved up by one (a token inserted at id 0), keeping the size: the classic off-by-one."""
        return replace(
            self,
            tokens=("<pad>",) + self.tokens[:-1],
            token_types=(int(TokenType.CONTROL),) + self.token_types[:-1],
            scores=(0.0,) + self.scores[:-1],
            bos_id=None if self.bos_id is None else self.bos_id + 1,
            eos_id=None if self.eos_id is None else self.eos_id + 1,
            unk_id=None if self.unk_id is None else self.unk_id + 1,
        )


def letter_pieces() -> Iterator[str]:
    """Letter pieces breadth-first: every prefix of a piece comes before it, so any cut is prefix-closed."""
    level = [""]
    while True:
        next_level = [piece + letter for piece in level for letter in LETTERS]
        yield from (SPACE_PIECE + piece for piece in next_level)
        yield from (piece for piece in next_level if len(piece) > 1)  # single letters are already base pieces
        level = next_level


def spm_vocabulary(size: int = 512) -> Vocabulary:
    """A SentencePiece-style vocabulary of exactly `size` tokens (at least 354: specials, bytes, ASCII)."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [int(TokenType.UNKNOWN), int(TokenType.CONTROL), int(TokenType.CONTROL)]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [int(TokenType.BYTE)] * 256
    # Without "▁" a lone space would fall back to... nothing useful: llama.cpp returns "▁" literally.
    base_pieces = [SPACE_PIECE] + [chr(c) for c in range(0x21, 0x7F)]
    if size < len(tokens) + len(base_pieces):
        raise ValueError(f"an SPM test vocabulary needs at least {len(tokens) + len(base_pieces)} tokens")
    pieces = base_pieces + list(_take(letter_pieces(), size - len(tokens) - len(base_pieces)))
    tokens += pieces
    types += [int(TokenType.NORMAL)] * len(pieces)
    # SPM merges the adjacent pair whose merged piece scores highest: prefer longer pieces so words stay whole.
    scores = [0.0] * 259 + [float(len(piece)) - index * 1e-4 for index, piece in enumerate(pieces)]
    return Vocabulary(tuple(tokens), tuple(types), tuple(scores))


def gpt2_vocabulary(size: int = 512) -> Vocabulary:
    """A byte-level BPE ("gpt2") vocabulary with merges: the 256 byte symbols, merged letter pieces, `<|endoftext|>`."""
    byte_symbols = _gpt2_byte_symbols()
    space = byte_symbols[ord(" ")]
    merged = []
    for piece in letter_pieces():
        if len(merged) == size - 257:
            break
        merged.append(piece.replace(SPACE_PIECE, space))
    tokens = byte_symbols + merged + ["<|endoftext|>"]
    types = [int(TokenType.NORMAL)] * (len(tokens) - 1) + [int(TokenType.CONTROL)]
    merges = tuple(f"{piece[:-1]} {piece[-1]}" for piece in merged)
    end = len(tokens) - 1
    return Vocabulary(
        tuple(tokens), tuple(types), (0.0,) * len(tokens),
        model="gpt2", pre="gpt-2", merges=merges,
        bos_id=end, eos_id=end, unk_id=None, add_bos=False, add_space_prefix=None,
    )


@dataclass(frozen=True)
class TinyConfig:
    """Shape and contents of one tiny llama model. Defaults load and run in milliseconds."""

    vocab_size: int = 512
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    context_length: int = 512
    rope_freq_base: float = 10000.0
    rms_norm_eps: float = 1e-5
    seed: int = 0
    # Logit temperature of the head: logits are ~N(0, head_scale^2) per token. 4.0 gives top-1
    # probabilities of roughly 0.2-0.8 at temperature 1 with vocab 512 (measured, see module docstring).
    head_scale: float = 4.0
    # Per-layer factor on attn_output and ffn_down (missing layers: 1.0). Scaling a layer's outputs
    # turns it into a small residual perturbation of the layers before it.
    layer_output_scales: tuple[float, ...] = ()
    weight_dtype: type = np.float32  # np.float32 or np.float16; norms are always F32
    vocab: Vocabulary | None = None  # None: spm_vocabulary(vocab_size)
    # Written last, overriding anything above: a value, or (value, GGUFValueType) for an explicit type.
    # A value of None removes the key.
    metadata: Mapping[str, Any] = field(default_factory=dict)
    vocab_only: bool = False  # no tensors at all, as llama.cpp's vocab files
    # Where given, token i's rows of token_embd and output are row token_rows[i] of the seeded ones: a model
    # of another vocabulary that computes what the seed's model does, token for token where they map.
    token_rows: tuple[int, ...] = ()

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def vocabulary(self) -> Vocabulary:
        return self.vocab if self.vocab is not None else spm_vocabulary(self.vocab_size)


def write_tiny_gguf(path: str | Path, config: TinyConfig = TinyConfig(), split_max_tensors: int = 0) -> Path:
    """Write one tiny llama GGUF file and return its path; with `split_max_tensors`, a model split in
    files of at most that many tensors (as gguf-split does), and return the first's path."""
    path = Path(path)
    vocab = config.vocabulary()
    metadata = _llama_metadata(config, vocab) | _tokenizer_metadata(vocab)
    metadata.update(config.metadata)

    writer = GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.kv_data[0].clear()  # general.architecture comes from `metadata`, so overrides can change it
    for key, value in metadata.items():
        if value is None:
            continue
        value, value_type = value if isinstance(value, tuple) and isinstance(value[-1], GGUFValueType) else (
            value, _value_type(value))
        writer.add_key_value(key, value, value_type)
    if isinstance(metadata.get("general.alignment"), int):  # the key says where the writer puts tensor data
        writer.data_alignment = metadata["general.alignment"]
    if not config.vocab_only:
        for name, tensor in _tensors(config, vocab.size):
            writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)[0]


def write_related_pair(
    directory: str | Path,
    *,
    target_layers: int = 8,
    draft_layers: int = 2,
    eps: float = 0.05,
    config: TinyConfig = TinyConfig(),
    name: str = "tiny",
) -> tuple[Path, Path]:
    """Write a (target, draft) pair whose draft is the target's first `draft_layers` layers, bit for bit.

    token_embd, output_norm, output and layers 0..draft_layers-1 are identical in both files; the target's
    layers from `draft_layers` on have attn_output and ffn_down scaled by `eps`, so they nudge the residual
    stream by an amount proportional to eps. eps=0 makes the extra layers no-ops (agreement 1.0). With
    target_layers == draft_layers the two files have identical content.

    Measured greedy agreement (8 vs 2 layers, defaults otherwise, 4 prompts x 48 steps):
    eps 0 -> 1.00, eps 0.02 -> 0.94, eps 0.05 -> 0.89, eps 0.2 -> 0.65, eps 1.0 -> 0.04.
    """
    if not 0 < draft_layers <= target_layers:
        raise ValueError("need 0 < draft_layers <= target_layers")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    scales = (1.0,) * draft_layers + (eps,) * (target_layers - draft_layers)
    target = write_tiny_gguf(
        directory / f"{name}-target-{target_layers}L-eps{eps:g}.gguf",
        replace(config, n_layer=target_layers, layer_output_scales=scales),
    )
    draft = write_tiny_gguf(
        directory / f"{name}-draft-{draft_layers}L.gguf",
        replace(config, n_layer=draft_layers, layer_output_scales=scales[:draft_layers]),
    )
    return target, draft


def poisoned_copy(source: str | Path, destination: str | Path, tensor: str = "output_norm.weight",
                  value: float = float("nan")) -> Path:
    """A copy of `source` with every weight of `tensor` set to `value`, as a bad conversion or a backend
    bug breaks a file: NaN in the final norm makes every logit NaN."""
    from gguf import GGUFReader

    destination = Path(destination)
    shutil.copyfile(source, destination)
    reader = GGUFReader(destination, "r+")  # the file memory-mapped for writing
    [weights] = [t for t in reader.tensors if t.name == tensor]
    weights.data[...] = value
    reader.data.flush()
    return destination


def _llama_metadata(config: TinyConfig, vocab: Vocabulary) -> dict[str, Any]:
    uint32 = GGUFValueType.UINT32
    return {
        "general.architecture": "llama",
        "general.name": f"tiny-llama-{config.n_layer}L-{config.n_embd}E-seed{config.seed}",
        "general.file_type": (
            int(LlamaFileType.MOSTLY_F16 if config.weight_dtype == np.float16 else LlamaFileType.ALL_F32), uint32),
        "llama.vocab_size": (vocab.size, uint32),
        "llama.context_length": (config.context_length, uint32),
        "llama.embedding_length": (config.n_embd, uint32),
        "llama.block_count": (config.n_layer, uint32),
        "llama.feed_forward_length": (config.n_ff, uint32),
        "llama.attention.head_count": (config.n_head, uint32),
        "llama.attention.head_count_kv": (config.n_head_kv, uint32),
        "llama.rope.dimension_count": (config.head_dim, uint32),
        "llama.rope.freq_base": (config.rope_freq_base, GGUFValueType.FLOAT32),
        "llama.attention.layer_norm_rms_epsilon": (config.rms_norm_eps, GGUFValueType.FLOAT32),
    }


def _tokenizer_metadata(vocab: Vocabulary) -> dict[str, Any]:
    uint32 = GGUFValueType.UINT32
    metadata: dict[str, Any] = {
        "tokenizer.ggml.model": vocab.model,
        "tokenizer.ggml.pre": vocab.pre,
        "tokenizer.ggml.tokens": list(vocab.tokens),
        "tokenizer.ggml.scores": list(vocab.scores),
        "tokenizer.ggml.token_type": list(vocab.token_types),
        "tokenizer.ggml.merges": list(vocab.merges) or None,
        "tokenizer.ggml.bos_token_id": None if vocab.bos_id is None else (vocab.bos_id, uint32),
        "tokenizer.ggml.eos_token_id": None if vocab.eos_id is None else (vocab.eos_id, uint32),
        "tokenizer.ggml.unknown_token_id": None if vocab.unk_id is None else (vocab.unk_id, uint32),
        "tokenizer.ggml.add_bos_token": vocab.add_bos,
        "tokenizer.ggml.add_eos_token": vocab.add_eos,
        "tokenizer.ggml.add_space_prefix": vocab.add_space_prefix,
        "tokenizer.chat_template": vocab.chat_template,
    }
    return metadata


def _tensors(config: TinyConfig, vocab_size: int) -> Iterator[tuple[str, np.ndarray]]:
    """Tensors in numpy shape order (the reverse of ggml's), each from its own (seed, name) stream."""
    E, F = config.n_embd, config.n_ff
    q_rows, kv_rows = config.n_head * config.head_dim, config.n_head_kv * config.head_dim

    def weight(name: str, shape: tuple[int, int], std: float) -> tuple[str, np.ndarray]:
        rng = np.random.default_rng([config.seed, zlib.crc32(name.encode())])
        values = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        return name, values.astype(config.weight_dtype)

    def norm(name: str) -> tuple[str, np.ndarray]:
        return name, np.ones(E, dtype=np.float32)

    def token_weight(name: str, std: float) -> tuple[str, np.ndarray]:
        name, values = weight(name, (vocab_size, E), std)
        return name, values[list(config.token_rows)] if config.token_rows else values

    yield token_weight("token_embd.weight", 1.0)
    yield norm("output_norm.weight")
    # The final norm leaves unit-RMS hidden states, so logits are ~N(0, head_scale^2).
    yield token_weight("output.weight", config.head_scale / np.sqrt(E))
    for layer in range(config.n_layer):
        scale = config.layer_output_scales[layer] if layer < len(config.layer_output_scales) else 1.0
        prefix = f"blk.{layer}"
        yield norm(f"{prefix}.attn_norm.weight")
        yield weight(f"{prefix}.attn_q.weight", (q_rows, E), 1 / np.sqrt(E))
        yield weight(f"{prefix}.attn_k.weight", (kv_rows, E), 1 / np.sqrt(E))
        yield weight(f"{prefix}.attn_v.weight", (kv_rows, E), 1 / np.sqrt(E))
        yield weight(f"{prefix}.attn_output.weight", (E, q_rows), scale / np.sqrt(q_rows))
        yield norm(f"{prefix}.ffn_norm.weight")
        yield weight(f"{prefix}.ffn_gate.weight", (F, E), 1 / np.sqrt(E))
        yield weight(f"{prefix}.ffn_up.weight", (F, E), 1 / np.sqrt(E))
        yield weight(f"{prefix}.ffn_down.weight", (E, F), scale / np.sqrt(F))


def _value_type(value: Any) -> GGUFValueType:
    # Scalar ints are uint32 as in real llama files (ids, counts); arrays take gguf's own inference.
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.UINT32
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple)):
        return GGUFValueType.ARRAY
    raise TypeError(f"no GGUF type for {value!r}")


def _gpt2_byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255 (so a space is "Ġ" and a newline "Ċ")."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    symbols, shift = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + shift)
            shift += 1
    return [symbols[byte] for byte in range(256)]


def _take(iterator, count: int) -> list:
    return [item for _, item in zip(range(count), iterator)]
