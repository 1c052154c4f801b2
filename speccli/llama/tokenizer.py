"""Loading a GGUF file into llama.cpp (checked first, stopped by Ctrl-C), and its vocabulary: text <-> token ids."""
from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import llama_cpp

from speccli.errors import UnreadableFileError
from speccli.gguf_files import require_loadable_gguf
from speccli.llama.log import clear_errors, init_backend, last_llama_error
from speccli.util.interrupts import ctrl_c_as_flag


@contextmanager
def interruptible() -> Iterator[Callable[[], bool]]:
    """Ctrl-C during a long llama.cpp call (loading weights, allocating a context) stops it promptly.

    Python runs a signal handler only when Python code runs: inside a llama.cpp call that is the log
    or progress callback, where a KeyboardInterrupt cannot unwind through C (ctypes prints it and
    carries on: the load went on, and the command exited 0). So while the call runs, Ctrl-C only
    sets a flag; the progress callback reads it and asks llama.cpp to stop loading, and on the way
    out the interrupt is raised here, in Python, where it can unwind.
    """
    with ctrl_c_as_flag() as requested:
        yield requested
    if requested():
        raise KeyboardInterrupt


def load_model(path: Path, *, n_gpu_layers: int, vocab_only: bool, devices: ctypes.Array | None = None,
               tensor_split: Sequence[float] = ()) -> llama_cpp.llama_model_p:
    """`devices`: a NULL-terminated array of ggml devices to place layers on (None: every device);
    `tensor_split`: the share of each of them (empty: by their free memory)."""
    init_backend()
    # Refused in one line where llama.cpp would fail to load or abort: a missing or unreadable file, a
    # directory, a loop of symbolic links, anything not GGUF, a token twice in the vocabulary, and
    # (weights only) a file cut short.
    require_loadable_gguf(path, weights=not vocab_only)
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers  # -1: every layer
    params.vocab_only = vocab_only
    if devices is not None:
        params.devices = ctypes.cast(devices, ctypes.c_void_p)
    if tensor_split:
        split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*tensor_split)
        params.tensor_split = split
    clear_errors()
    model = None
    try:
        with interruptible() as interrupted:
            # Kept referenced until llama.cpp returns: it calls back into this object.
            keep_loading = llama_cpp.llama_progress_callback(lambda _progress, _user_data: not interrupted())
            params.progress_callback = keep_loading
            model = llama_cpp.llama_model_load_from_file(os.fsencode(path), params)
    except KeyboardInterrupt:
        if model:
            llama_cpp.llama_model_free(model)
        raise
    if not model:
        raise UnreadableFileError(f"{path}: llama.cpp could not load it{last_llama_error()}")
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
        self._special_pieces: dict[int, bytes] = {}
        self._grammar_vocabulary: Any = None
        self._grammar_building = threading.Lock()  # serve's requests ask at once: built once, the others wait

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
        capacity = len(data) + 16
        while True:
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_special, parse_special)
            if count >= 0:
                return list(buffer[:count])
            capacity = -count

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for; special tokens render as nothing, or as their text (`special`)."""
        pieces = self._special_pieces if special else self._pieces
        piece = pieces.get(token)
        if piece is None:
            buffer = ctypes.create_string_buffer(64)
            length = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 64, 0, special)
            if length < 0:
                buffer = ctypes.create_string_buffer(-length)
                length = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, -length, 0, special)
            piece = pieces[token] = buffer.raw[:length]
        return piece

    def token_text(self, token: int) -> str:
        """A token's text as the vocabulary spells it (special tokens included, e.g. "<s>"); "" for -1."""
        if token < 0:
            return ""
        return llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8", errors="replace")

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        return b"".join(self.token_bytes(token, special) for token in tokens)

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def grammar_vocabulary(self) -> Any:
        """The vocabulary as llguidance reads it, for grammar masks (core/constraint.py): each token's
        bytes, control tokens marked as llguidance's own reader marks them, every end-of-generation token
        as one it allows where a grammar may end. Built once, in seconds at 262k tokens (its index of
        the tokens' bytes is most of it), and kept with this tokenizer, whose model it calls to tokenize."""
        with self._grammar_building:
            if self._grammar_vocabulary is None:
                self._grammar_vocabulary = self._build_grammar_vocabulary()
        return self._grammar_vocabulary

    def _build_grammar_vocabulary(self) -> Any:
        import llguidance

        lib = llama_cpp.llama_cpp._lib  # the C functions themselves: llama_cpp's wrappers cost 3x more per call
        buffer = ctypes.create_string_buffer(256)
        pieces, ends = [], []
        for token in range(self.n_vocab):
            length = lib.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, True)
            piece = buffer.raw[:length] if length >= 0 else self.token_bytes(token, special=True)
            if self._marks_special(token, piece):
                piece = b"\xff" + piece
            pieces.append(piece)
            if lib.llama_vocab_is_eog(self._vocab, token):
                ends.append(token)
        tokenize = ctypes.cast(lib.llama_tokenize, ctypes.c_void_p).value
        return llguidance.LLTokenizer.from_llamacpp(
            tokens=pieces, vocab_ptr=self._vocab, tokenize_fptr=tokenize, eos_token=ends or [self.eos_id], slices=None)

    def _marks_special(self, token: int, piece: bytes) -> bool:
        """Whether llguidance reads the token as a special one, as its own reader of llama.cpp's vocabularies
        does: control tokens, and added ones written like <this>."""
        attributes = llama_cpp.llama_cpp._lib.llama_vocab_get_attr(self._vocab, token)
        return bool(attributes & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
            attributes & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")))

    def is_special_text(self, text: str) -> bool:
        """Whether `text` is one token that grammars name as a special token (`<tool_call>` in Lark)."""
        tokens = self.tokenize(text, False, True)
        return len(tokens) == 1 and self._marks_special(tokens[0], text.encode())

    @property
    def chat_template(self) -> str | None:
        template = llama_cpp.llama_model_chat_template(self._model, None)
        return template.decode("utf-8", errors="replace") if template else None

    def close(self) -> None:
        model, self._model = self._model, None  # off the object first, so it is never freed twice (see Model.close)
        self._grammar_vocabulary = None  # it calls into the model
        if self._owns_model and model:
            llama_cpp.llama_model_free(model)

    def __enter__(self) -> Tokenizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def load_vocab_only(path: Path) -> Tokenizer:
    """The tokenizer of a GGUF file, without loading its weights."""
    return Tokenizer(path, load_model(Path(path), n_gpu_layers=0, vocab_only=True), owns_model=True)

