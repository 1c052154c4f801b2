"""A loaded model and its KV sequences, decoded in batches (llama-cpp-python's low-level API).

Everything above `speccli.llama` sees plain Python and numpy: token ids in, logits rows out. Two choices matter:

* `decode` asks llama.cpp for logits only on the rows the caller needs (per-token flags in a
  `llama_batch`), and returns them as a numpy view of llama.cpp's own buffer. Nothing ever holds
  n_ctx x n_vocab floats (`Llama(logits_all=True)` would: 2 GiB for Gemma's 262k vocabulary).
* `truncate` drops a suffix of the KV cache, which is how rejected draft tokens are forgotten.
  Recurrent and hybrid models cannot do that, so they are refused at load time.
* A model holds one sequence, or several (serve's slots, `LoadOptions.n_seq`) in one cache:
  `decode_together` decodes tokens of several in one llama_decode.
"""
from __future__ import annotations

import ctypes
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

import llama_cpp

from speccli.errors import NonFiniteLogitsError, SpeccliError
from speccli.gguf_meta import trained_context_length
from speccli.llama import rpc
from speccli.llama.clock import COMPUTE_CLOCK
from speccli.llama.log import clear_errors, last_llama_error
from speccli.llama.rpc import Endpoint
from speccli.llama.tokenizer import Tokenizer, interruptible, load_model
from speccli.validation import CHAT_CTX, MIN_CTX


# How llama.cpp reports a failed allocation when it creates a context: ggml's own malloc failing, or a
# std::bad_alloc it catches (it then returns no context, logging the exception's text).
_OUT_OF_MEMORY = re.compile(r"insufficient memory|bad_alloc|failed to allocate|out of memory", re.IGNORECASE)


class ContextFullError(SpeccliError):
    """The tokens to decode do not fit in what is left of the context window."""



@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = CHAT_CTX
    n_gpu_layers: int = -1  # -1: offload every layer (ignored by CPU-only builds)
    n_threads: int | None = None  # None: every core; draft and target never run at once
    n_batch: int = 512
    n_seq: int = 1  # sequences in the KV cache (serve's --parallel slots), sharing n_ctx
    rpc: tuple[Endpoint, ...] = ()  # RPC servers to place layers on (connected first: see speccli.llama.rpc)
    tensor_split: tuple[float, ...] = ()  # each device's share of the layers; empty: by free memory


def trained_context(path: Path) -> int | None:
    """The context `path` was trained with, from its GGUF header (None where it does not say), refused
    below speccli's least --ctx: such a model could only run at a context speccli refuses (an 8-token
    model ran at 8, where --ctx 8 is refused and --ctx 16 is past its training)."""
    trained = trained_context_length(path)
    if trained is not None and trained < MIN_CTX:
        raise SpeccliError(f"{path}: the model was trained with a context of {trained} tokens, below speccli's minimum "
                           f"of {MIN_CTX} tokens")
    return trained


def check_decode(tokens: Sequence[int], n_logit_rows: int, n_past: int, n_ctx: int, n_batch: int) -> None:
    """What a decode refuses before it reaches llama.cpp (a stand-in model refuses the same)."""
    if not tokens:
        raise ValueError("decode needs at least one token")
    if not 0 <= n_logit_rows <= len(tokens):
        raise ValueError(f"n_logit_rows={n_logit_rows} with {len(tokens)} tokens")
    if n_logit_rows > n_batch:
        raise ValueError(f"at most n_batch={n_batch} logit rows per decode")
    if n_past + len(tokens) > n_ctx:
        raise ContextFullError(f"the context window is full ({n_past} + {len(tokens)} tokens > n_ctx {n_ctx})")


def check_ctx_within_training(n_ctx: int, n_seq: int, path: Path, name: str | None = None) -> None:
    """Read from the GGUF header before any weights: past its training context a model's output means
    little, and llama.cpp would still try to allocate the KV cache (--ctx 1000000000 grew to 20 GB
    before it failed). Each of several sequences holds its share. `name`: the model as the user named
    it (a registry name), where not its file's."""
    name = name or path.name
    trained = trained_context(path)
    if trained is not None and n_ctx // n_seq > trained:
        if n_seq > 1:
            raise SpeccliError(f"--ctx {n_ctx} gives each of {n_seq} slots {n_ctx // n_seq} tokens, more than the {trained} "
                               f"tokens {name} was trained with; use at most {trained * n_seq}")
        raise SpeccliError(f"--ctx {n_ctx} is more than the {trained} tokens {name} was trained with; use at most {trained}")


class Model:
    """A loaded model with one sequence in its KV cache, decoded in batches."""

    def __init__(self, path: Path, options: LoadOptions = LoadOptions(), name: str | None = None) -> None:
        self.path = Path(path)
        self.name = Path(name).name if name else self.path.name  # as the user named it: a registry name, else its file's
        self.options = options  # as asked; n_ctx and n_batch below are what llama.cpp chose
        check_ctx_within_training(options.n_ctx, options.n_seq, self.path)
        devices = rpc.model_devices(options.rpc)  # kept referenced until the model is loaded
        self._model = load_model(self.path, n_gpu_layers=options.n_gpu_layers, vocab_only=False, devices=devices,
                                 tensor_split=options.tensor_split)
        self.placement = rpc.placement(options.rpc, options.n_gpu_layers)  # where it runs, in a few words
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
        # Several sequences (serve's slots) share one cache, unified: a decode of all their rows is one
        # pass (a cache split per sequence decodes sequences of unequal lengths in several: llama.cpp's
        # split_equal); speccli bounds each sequence to its share of the context (`n_ctx_seq`).
        params.n_seq_max = options.n_seq
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = threads
        # Sliding-window models (Gemma 3) must keep the whole window history: dropping a suffix of
        # rejected drafts is only exact with the full-size SWA cache (llama.cpp's default; made explicit).
        params.swa_full = True
        clear_errors()
        self._ctx = None  # set before a Ctrl-C can land: the handler below reads it
        try:
            with interruptible():
                self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        except KeyboardInterrupt:
            if self._ctx:
                llama_cpp.llama_free(self._ctx)
                self._ctx = None
            llama_cpp.llama_model_free(self._model)
            raise
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            cause = last_llama_error()
            if _OUT_OF_MEMORY.search(cause):
                raise SpeccliError(
                    f"{self.path}: not enough memory for a {options.n_ctx}-token context; lower --ctx{cause}"
                )
            raise SpeccliError(f"{self.path}: llama.cpp could not create a context{cause}")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        # llama.cpp may round the context up and clamp the batch to it: use what it chose.
        self.n_ctx: int = llama_cpp.llama_n_ctx(self._ctx)
        self.n_batch: int = llama_cpp.llama_n_batch(self._ctx)
        self.n_vocab = self.tokenizer.n_vocab
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.n_seq = options.n_seq
        # Each sequence's share of the context, as llama-server splits its --ctx between slots.
        self.n_ctx_seq = self.n_ctx // self.n_seq
        self._sequences = [KVSequence(self, seq_id) for seq_id in range(self.n_seq)]
        self._views: dict[tuple[int, int], np.ndarray] = {}  # numpy views of llama.cpp's buffer, by (address, rows)
        self.decodes = self.decoded_rows = 0  # llama_decode calls and the tokens they took

    def sequence(self, seq_id: int) -> KVSequence:
        """Sequence `seq_id` of the KV cache (0 .. n_seq - 1), with the same calls as the model's own (0)."""
        if not 0 <= seq_id < self.n_seq:
            raise ValueError(f"sequence {seq_id} of {self.n_seq}")
        return self._sequences[seq_id]

    # The model's own calls are sequence 0's: a model loaded with one sequence is used as one.
    companion_rows = 0
    @property
    def n_past(self) -> int:
        return self._sequences[0].n_past

    @n_past.setter
    def n_past(self, n_tokens: int) -> None:  # a test's broken truncate moves it by hand
        self._sequences[0].n_past = n_tokens

    @property
    def decoded_tokens(self) -> int:
        return self._sequences[0].decoded_tokens

    def decode(self, tokens: Sequence[int], n_logit_rows: int = 1) -> np.ndarray:
        return self._sequences[0].decode(tokens, n_logit_rows)

    def truncate(self, n_tokens: int) -> None:
        self._sequences[0].truncate(n_tokens)

    def time_decode(self, tokens: Sequence[int], n_logit_rows: int) -> float:
        return self._sequences[0].time_decode(tokens, n_logit_rows)

    def gave_non_finite_logits(self) -> bool:
        return self._sequences[0].gave_non_finite_logits()

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)
        for sequence in self._sequences:
            sequence.n_past = 0

    def decode_together(self, parts: Sequence[tuple[KVSequence, Sequence[int], int]]) -> list[np.ndarray]:
        """One llama_decode of several sequences' tokens: (sequence, tokens, n_logit_rows) each, at most
        n_batch tokens in all, appended to each sequence; the logits of each part's last n_logit_rows
        tokens, views of llama.cpp's buffer valid until the next decode of this model (any sequence's)."""
        total = sum(len(tokens) for _, tokens, _ in parts)
        if not 0 < total <= self.n_batch:  # checked first: the batch's arrays hold n_batch tokens
            raise ValueError(f"{total} tokens in one decode: 1 to n_batch={self.n_batch}")
        for sequence in self._sequences:  # each one's last rows are views of the buffer this decode rewrites
            sequence.last_logits = None
        batch = self._batch
        i = 0
        for sequence, tokens, n_logit_rows in parts:
            first_with_logits = len(tokens) - n_logit_rows
            for j, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = sequence.n_past + j
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = sequence.seq_id
                batch.logits[i] = j >= first_with_logits
                i += 1
        batch.n_tokens = i
        clear_errors()
        began = time.perf_counter()
        status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            # On failure llama.cpp may keep part of the batch: drop it, so each n_past stays true.
            for sequence, _, _ in parts:
                llama_cpp.llama_memory_seq_rm(self._memory, sequence.seq_id, sequence.n_past, -1)
            raise SpeccliError(f"{self.path}: llama_decode failed with status {status}{last_llama_error()}")
        # llama_decode may return before the work is done (CUDA; a target over RPC: 6 ms for a 237-token
        # prefill whose compute then landed on the next decode's clock, 1.7 s). Wait for it here, so each
        # decode's time is its own (reading logits waits anyway). llama_synchronize waits for local
        # devices only: an RPC server has finished once it answers a question asked after the work.
        llama_cpp.llama_synchronize(self._ctx)
        if self.options.rpc and self.options.n_gpu_layers != 0 and not any(rows for _, _, rows in parts):
            rpc.wait_for(self.options.rpc)
        COMPUTE_CLOCK.seconds += time.perf_counter() - began
        self.decodes += 1
        self.decoded_rows += i
        rows, end = [], 0
        for sequence, tokens, n_logit_rows in parts:
            end += len(tokens)
            sequence.n_past += len(tokens)
            sequence.decoded_tokens += len(tokens)
            rows.append(self._logit_rows(end, n_logit_rows))
        return rows

    def _logit_rows(self, end: int, n_rows: int) -> np.ndarray:
        """Logits of the `n_rows` tokens before batch index `end` of the batch just decoded."""
        if n_rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        first_index = end - n_rows
        first = llama_cpp.llama_get_logits_ith(self._ctx, first_index)
        last = llama_cpp.llama_get_logits_ith(self._ctx, end - 1)
        row_bytes = self.n_vocab * ctypes.sizeof(ctypes.c_float)
        first_address = ctypes.cast(first, ctypes.c_void_p).value
        if ctypes.cast(last, ctypes.c_void_p).value == first_address + (n_rows - 1) * row_bytes:
            # llama.cpp keeps one output buffer: the view of a decode's rows is most often one seen before.
            view = self._views.get((first_address, n_rows))
            if view is None:
                if len(self._views) > 64:
                    self._views.clear()
                view = self._views[first_address, n_rows] = np.ctypeslib.as_array(first, shape=(n_rows, self.n_vocab))
            return view
        # llama.cpp kept the rows apart (e.g. split across micro-batches): gather them.
        return np.stack([
            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, i), shape=(self.n_vocab,))
            for i in range(first_index, end)
        ])

    def close(self) -> None:
        """Free the batch, context and weights, once. Each is taken off the object before llama.cpp frees
        it: a Ctrl-C landing between two of the calls (Python runs signal handlers between them) used to
        leave them all set, and `__del__` freed the batch a second time (heap corruption, exit 134). Now
        the worst an interrupt can do here is leak what is left, as the process ends anyway."""
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if not ctx or rpc.lost():  # freeing would wait on the lost server's parked thread
            return
        self._views = {}  # views of the context's buffer, freed below
        for sequence in getattr(self, "_sequences", ()):
            sequence.last_logits = None
        batch, self._batch = getattr(self, "_batch", None), None
        model, self._model = self._model, None
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class KVSequence:
    """One sequence of a model's KV cache, decoded in batches: what a generator or a drafter decodes into.
    A model's own calls are its sequence 0's; serve's slots each take one of `Model.sequence(i)`."""

    companion_rows = 0  # other sequences' tokens in its last decode (serve's slots set it)

    def __init__(self, model: Model, seq_id: int) -> None:
        self.model, self.seq_id = model, seq_id
        self.path, self.options, self.tokenizer = model.path, model.options, model.tokenizer
        self.n_vocab, self.n_batch, self.n_ctx = model.n_vocab, model.n_batch, model.n_ctx_seq
        self.n_past = 0  # tokens held, at positions 0 .. n_past-1
        self.decoded_tokens = 0
        self.last_logits: np.ndarray | None = None  # what the last decode returned (see gave_non_finite_logits)

    def decode(self, tokens: Sequence[int], n_logit_rows: int = 1) -> np.ndarray:
        """Append `tokens` to the sequence; return logits for its last `n_logit_rows` tokens.

        The result has shape (n_logit_rows, n_vocab) and is a view of llama.cpp's buffer: valid only
        until the next decode on this model. Copy what must outlive it.
        """
        self.last_logits = None  # llama.cpp may move its buffer: never kept past a decode, failed or not
        check_decode(tokens, n_logit_rows, self.n_past, self.n_ctx, self.n_batch)
        # Everything but the last n_batch tokens goes first, without logits; the rows asked for
        # then all come from one llama_decode call, so they can be one view of its buffer.
        split = max(0, len(tokens) - self.n_batch)
        for start in range(0, split, self.n_batch):
            self.model.decode_together([(self, tokens[start : min(start + self.n_batch, split)], 0)])
        [self.last_logits] = self.model.decode_together([(self, tokens[split:], n_logit_rows)])
        return self.last_logits

    def truncate(self, n_tokens: int) -> None:
        """Forget every token from position `n_tokens` on (the rejected drafts)."""
        if n_tokens < self.n_past:
            if not llama_cpp.llama_memory_seq_rm(self.model._memory, self.seq_id, n_tokens, -1):
                raise SpeccliError(f"{self.path}: llama.cpp could not drop tokens from position {n_tokens}")
            self.n_past = n_tokens

    def reset(self) -> None:
        self.truncate(0)

    def time_decode(self, tokens: Sequence[int], n_logit_rows: int) -> float:
        """Seconds of one decode of `tokens` at the sequence's end, which then holds what it held before: a
        cost probe (profiling v(n), a draft's cost, a quant's speed)."""
        start = self.n_past
        began = time.perf_counter()
        self.decode(tokens, n_logit_rows)
        seconds = time.perf_counter() - began
        self.truncate(start)
        return seconds

    def gave_non_finite_logits(self) -> bool:
        """Whether a row of the last decode's logits is no distribution (a NaN or +inf in it, or no finite
        value): asked once sampling has refused a row, so as to name the model; never on the hot path."""
        rows = self.last_logits
        if rows is None or not rows.size:
            return False
        return bool((np.isnan(rows) | np.isposinf(rows)).any() or not np.isfinite(rows).any(axis=1).all())


@contextmanager
def naming_non_finite_logits(
    target: Model, draft: Model | None, name: Callable[[Model], str] = lambda model: str(model.path)
) -> Iterator[None]:
    """Sampling refuses logits that are no distribution without knowing whose they are (NonFiniteLogitsError):
    within this block, that error names the model(s) whose last decode gave them, by `name` (the path;
    a server tells its clients the file name only). A step decodes the draft first, so a draft whose
    logits broke fails before the target decodes again."""
    try:
        yield
    except NonFiniteLogitsError as error:
        broken = [(role, model) for role, model in (("target", target), ("draft", draft))
                  if model is not None and model.gave_non_finite_logits()]
        if not broken:
            raise
        who = " and ".join(f"{name(model)} (the {role} model)" for role, model in broken)
        whose = "its logits are" if len(broken) == 1 else "their logits are"
        raise NonFiniteLogitsError(f"{who}: {whose} not finite (NaN or infinity), so no token can be drawn from "
                                   f"them; check the file against its source") from error


def shared_context(target: Model, draft: Model | None) -> int:
    """The tokens both models can hold in a sequence: the context a conversation or a prompt must fit."""
    return target.n_ctx_seq if draft is None else min(target.n_ctx_seq, draft.n_ctx_seq)
