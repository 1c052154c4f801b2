"""The only module that talks to llama.cpp (through llama-cpp-python's low-level API).

Everything above it sees plain Python and numpy: token ids in, logits rows out. Two choices matter:

* `decode` asks llama.cpp for logits only on the rows the caller needs (per-token flags in a
  `llama_batch`), and returns them as a numpy view of llama.cpp's own buffer. Nothing ever holds
  n_ctx x n_vocab floats (`Llama(logits_all=True)` would: 2 GiB for Gemma's 262k vocabulary).
* `truncate` drops a suffix of the KV cache, which is how rejected draft tokens are forgotten.
  Recurrent and hybrid models cannot do that, so they are refused at load time.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

import llama_cpp

from speccli.errors import SpeccliError, UnreadableFileError

# llama.cpp's file types that `quantize_model` can write, by the names llama.cpp's tools use.
FILE_TYPES = {
    "F32": llama_cpp.LLAMA_FTYPE_ALL_F32,
    "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "BF16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
}


class ContextFullError(SpeccliError):
    """The tokens to decode do not fit in what is left of the context window."""


# --- llama.cpp's log: kept quiet, but its errors go into our messages --------------------

_recent_errors: deque[str] = deque(maxlen=20)
_GGML_LOG_LEVEL_ERROR = 4  # ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_GGML_LOG_LEVEL_CONT = 5  # continues the previous message, at that message's level
_last_level = 0


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    global _last_level
    line = text.decode("utf-8", errors="replace")
    if os.environ.get("SPECCLI_LLAMA_LOG"):
        print(line, end="", flush=True, file=sys.stderr)
    if level != _GGML_LOG_LEVEL_CONT:
        _last_level = level
    if _last_level == _GGML_LOG_LEVEL_ERROR and line.strip():
        _recent_errors.append(line.strip())


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def _last_llama_error() -> str:
    """llama.cpp's first error line since the call began, the cause; the later ones only pass it on.
    (`_recent_errors` is cleared before each call.)"""
    return f" (llama.cpp: {_recent_errors[0]})" if _recent_errors else ""


# --- what this build of llama.cpp can do ----------------------------------------------------


@dataclass(frozen=True)
class BackendInfo:
    llama_cpp_python_version: str
    backend: str  # "CPU", "CUDA", "Metal", ...
    gpu_offload: bool
    system_info: str

    @property
    def summary(self) -> str:
        offload = "GPU offload supported" if self.gpu_offload else "no GPU offload"
        return f"{self.backend}, {offload}"


def backend_info() -> BackendInfo:
    _init_backend()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    gpu_backends = [name for name in ("CUDA", "Metal", "Vulkan", "SYCL", "HIP", "OpenCL") if name in system_info]
    return BackendInfo(
        llama_cpp_python_version=llama_cpp.__version__,
        backend=" + ".join(gpu_backends + ["CPU"]),
        gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
        system_info=re.sub(r"\s+", " ", system_info),
    )


def quantize_model(source: Path, dest: Path, file_type: str) -> None:
    """Write `source` re-encoded as `file_type` (e.g. upcast Q4_K_M to F32) to `dest`, not atomically."""
    _init_backend()
    if file_type not in FILE_TYPES:
        raise SpeccliError(f"unknown file type {file_type!r}; known: {', '.join(FILE_TYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.allow_requantize = True  # the source is already quantized: dequantize, then re-encode
    params.nthread = os.cpu_count() or 1
    _recent_errors.clear()
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
    if status != 0:
        raise SpeccliError(f"{source}: llama.cpp could not convert it to {file_type}{_last_llama_error()}")


# --- loading ----------------------------------------------------------------------------------


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise UnreadableFileError(f"{path}: no such file")
    if path.is_dir():
        raise UnreadableFileError(f"{path}: is a directory, not a GGUF file")
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as error:
        raise UnreadableFileError(f"{path}: cannot read it ({error.strerror})") from None
    if magic != b"GGUF":
        raise UnreadableFileError(f"{path}: not a GGUF file")


def _load_model(path: Path, *, n_gpu_layers: int, vocab_only: bool) -> llama_cpp.llama_model_p:
    _init_backend()
    _check_readable(path)
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers  # -1: every layer
    params.vocab_only = vocab_only
    _recent_errors.clear()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise UnreadableFileError(f"{path}: llama.cpp could not load it{_last_llama_error()}")
    return model


class Tokenizer:
    """A model's vocabulary: text <-> token ids. Loads no weights when made by `load_vocab_only`."""

    def __init__(self, path: Path, model: llama_cpp.llama_model_p, owns_model: bool) -> None:
        self.path = path
        self._model = model
        self._owns_model = owns_model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.bos_id: int = llama_cpp.llama_vocab_bos(self._vocab)  # -1 when the vocabulary has none
        self.eos_id: int = llama_cpp.llama_vocab_eos(self._vocab)
        self.adds_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self._pieces: dict[int, bytes] = {}

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
        capacity = len(data) + 16
        while True:
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_special, parse_special)
            if count >= 0:
                return list(buffer[:count])
            capacity = -count

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as nothing)."""
        piece = self._pieces.get(token)
        if piece is None:
            buffer = ctypes.create_string_buffer(64)
            length = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 64, 0, False)
            if length < 0:
                buffer = ctypes.create_string_buffer(-length)
                length = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, -length, 0, False)
            piece = self._pieces[token] = buffer.raw[:length]
        return piece

    def token_text(self, token: int) -> str:
        """A token's text as the vocabulary spells it (special tokens included, e.g. "<s>"); "" for -1."""
        if token < 0:
            return ""
        return llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return b"".join(self.token_bytes(token) for token in tokens)

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    @property
    def chat_template(self) -> str | None:
        template = llama_cpp.llama_model_chat_template(self._model, None)
        return template.decode("utf-8", errors="replace") if template else None

    def close(self) -> None:
        if self._owns_model and self._model:
            llama_cpp.llama_model_free(self._model)
        self._model = None

    def __enter__(self) -> Tokenizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def load_vocab_only(path: Path) -> Tokenizer:
    """The tokenizer of a GGUF file, without loading its weights."""
    return Tokenizer(path, _load_model(Path(path), n_gpu_layers=0, vocab_only=True), owns_model=True)


@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096
    n_gpu_layers: int = -1  # -1: offload every layer (ignored by CPU-only builds)
    n_threads: int | None = None  # None: every core; draft and target never run at once
    n_batch: int = 512


class Model:
    """A loaded model with one sequence in its KV cache, decoded in batches."""

    def __init__(self, path: Path, options: LoadOptions = LoadOptions()) -> None:
        self.path = Path(path)
        self.options = options  # as asked; n_ctx and n_batch below are what llama.cpp chose
        self._model = _load_model(self.path, n_gpu_layers=options.n_gpu_layers, vocab_only=False)
        self.tokenizer = Tokenizer(self.path, self._model, owns_model=False)
        if llama_cpp.llama_model_is_recurrent(self._model) or llama_cpp.llama_model_is_hybrid(self._model):
            llama_cpp.llama_model_free(self._model)
            raise SpeccliError(
                f"{self.path}: a recurrent or hybrid model cannot drop rejected draft tokens from its "
                "memory, so speccli cannot run speculative decoding with it"
            )
        threads = options.n_threads or os.cpu_count() or 1
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = options.n_ctx
        params.n_batch = params.n_ubatch = options.n_batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        # Sliding-window models (Gemma 3) must keep the whole window history: dropping a suffix of
        # rejected drafts is only exact with the full-size SWA cache (llama.cpp's default; made explicit).
        params.swa_full = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise SpeccliError(f"{self.path}: llama.cpp could not create a context{_last_llama_error()}")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        # llama.cpp may round the context up and clamp the batch to it: use what it chose.
        self.n_ctx: int = llama_cpp.llama_n_ctx(self._ctx)
        self.n_batch: int = llama_cpp.llama_n_batch(self._ctx)
        self.n_vocab = self.tokenizer.n_vocab
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.n_past = 0  # tokens held in the KV cache, at positions 0 .. n_past-1
        self.decoded_tokens = 0

    def decode(self, tokens: Sequence[int], n_logit_rows: int = 1) -> np.ndarray:
        """Append `tokens` to the sequence; return logits for its last `n_logit_rows` tokens.

        The result has shape (n_logit_rows, n_vocab) and is a view of llama.cpp's buffer: valid only
        until the next decode on this model. Copy what must outlive it.
        """
        if not tokens:
            raise ValueError("decode needs at least one token")
        if not 0 <= n_logit_rows <= len(tokens):
            raise ValueError(f"n_logit_rows={n_logit_rows} with {len(tokens)} tokens")
        if n_logit_rows > self.n_batch:
            raise ValueError(f"at most n_batch={self.n_batch} logit rows per decode")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(
                f"the context window is full ({self.n_past} + {len(tokens)} tokens > n_ctx {self.n_ctx})"
            )
        # Everything but the last n_batch tokens goes first, without logits; the rows asked for
        # then all come from one llama_decode call, so they can be one view of its buffer.
        split = max(0, len(tokens) - self.n_batch)
        for start in range(0, split, self.n_batch):
            self._decode_chunk(tokens[start : min(start + self.n_batch, split)], n_logit_rows=0)
        tail = tokens[split:]
        self._decode_chunk(tail, n_logit_rows)
        return self._logit_rows(len(tail), n_logit_rows)

    def _decode_chunk(self, chunk: Sequence[int], n_logit_rows: int) -> None:
        batch = self._batch
        batch.n_tokens = len(chunk)
        first_with_logits = len(chunk) - n_logit_rows
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = self.n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_with_logits
        _recent_errors.clear()
        status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            # On failure llama.cpp may keep part of the batch: drop it, so n_past stays true.
            llama_cpp.llama_memory_seq_rm(self._memory, 0, self.n_past, -1)
            raise SpeccliError(f"{self.path}: llama_decode failed with status {status}{_last_llama_error()}")
        self.n_past += len(chunk)
        self.decoded_tokens += len(chunk)

    def _logit_rows(self, batch_size: int, n_rows: int) -> np.ndarray:
        """Logits of the last `n_rows` tokens of the batch just decoded."""
        if n_rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        first_index = batch_size - n_rows
        first = llama_cpp.llama_get_logits_ith(self._ctx, first_index)
        last = llama_cpp.llama_get_logits_ith(self._ctx, batch_size - 1)
        row_bytes = self.n_vocab * ctypes.sizeof(ctypes.c_float)
        first_address = ctypes.cast(first, ctypes.c_void_p).value
        if ctypes.cast(last, ctypes.c_void_p).value == first_address + (n_rows - 1) * row_bytes:
            return np.ctypeslib.as_array(first, shape=(n_rows, self.n_vocab))
        # llama.cpp kept the rows apart (e.g. split across micro-batches): gather them.
        return np.stack([
            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, i), shape=(self.n_vocab,))
            for i in range(first_index, batch_size)
        ])

    def truncate(self, n_tokens: int) -> None:
        """Forget every token from position `n_tokens` on (the rejected drafts)."""
        if n_tokens < self.n_past:
            if not llama_cpp.llama_memory_seq_rm(self._memory, 0, n_tokens, -1):
                raise SpeccliError(f"{self.path}: llama.cpp could not drop tokens from position {n_tokens}")
            self.n_past = n_tokens

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)
        self.n_past = 0

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            llama_cpp.llama_model_free(self._model)
            self._ctx = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
