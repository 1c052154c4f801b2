"""One GGUF file's tokenizer as its metadata states it (read with `speccli.gguf_meta`, no weights)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speccli.errors import UnreadableFileError
from speccli.gguf_files import SPLIT_COUNT, require_loadable_gguf
from speccli.gguf_meta import read_gguf_header


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


def read_vocab(path: str | Path) -> VocabInfo:
    """The tokenizer metadata of a GGUF file. Raises UnreadableFileError naming the file."""
    path = Path(path)
    metadata, tensor_count, needed = read_gguf_header(
        path, wanted=lambda key: key.startswith("tokenizer.") or key in ("general.architecture", SPLIT_COUNT)
    )
    model = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(model, str) or not isinstance(tokens, list):
        raise UnreadableFileError(f"{path}: GGUF file without tokenizer metadata (no tokenizer.ggml.model/tokens)")
    # With the weights: a file cut short holds its vocabulary, but no pair could load it.
    require_loadable_gguf(path, weights=True, header=(metadata, needed))
    special_ids, settings = {}, {}
    for key, value in metadata.items():
        name = key.removeprefix("tokenizer.ggml.")
        if name == key or name in ("model", "pre", "tokens", "token_type", "scores", "merges"):
            continue
        if name.endswith("_token_id"):
            if not isinstance(value, int) or isinstance(value, bool):  # llama.cpp: "key ... has wrong type"
                raise UnreadableFileError(f"{path}: {key} holds {value!r}, not a token id")
            special_ids[name.removesuffix("_token_id")] = value
        elif not isinstance(value, (list, np.ndarray)):
            settings[name] = value
    return VocabInfo(
        path=path,
        architecture=metadata.get("general.architecture"),
        model=model,
        pre=metadata.get("tokenizer.ggml.pre"),
        tokens=tokens,
        token_types=_per_token(path, metadata, "tokenizer.ggml.token_type", len(tokens)),
        scores=_per_token(path, metadata, "tokenizer.ggml.scores", len(tokens)),
        merges=_of_type(path, metadata, "tokenizer.ggml.merges", list),
        special_ids=special_ids,
        settings=settings,
        chat_template=_of_type(path, metadata, "tokenizer.chat_template", str),
        tensor_count=tensor_count,
    )


def _per_token(path: Path, metadata: dict[str, Any], key: str, n_tokens: int) -> np.ndarray | None:
    """A numeric array with one entry per token, or None where the file has none."""
    value = _of_type(path, metadata, key, np.ndarray)
    if value is not None and len(value) != n_tokens:
        raise UnreadableFileError(f"{path}: corrupt tokenizer metadata ({key} has {len(value)} entries for {n_tokens} tokens)")
    return value


def _of_type(path: Path, metadata: dict[str, Any], key: str, kind: type) -> Any:
    """metadata[key], None where absent; any other type than `kind` (a scalar where an array belongs)
    is a corrupt file, which comparing it would crash on."""
    value = metadata.get(key)
    if value is not None and not isinstance(value, kind):
        raise UnreadableFileError(f"{path}: corrupt tokenizer metadata ({key} is not {_KIND_NAMES[kind]})")
    return value


_KIND_NAMES = {np.ndarray: "a numeric array", list: "a string array", str: "a string"}
