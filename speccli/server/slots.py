"""Serve's slots: each runs its request's generation in its own thread, and their decodes meet here.

A slot's generator is the one chat and bench use, unchanged: it decodes through a `GatedSequence`, its
own sequence of the shared KV cache. A decode parks the slot at the `Rendezvous`; once every slot in a
generation is parked, the parked decodes of one model go to llama.cpp as one llama_decode (the draft
model's first: slots waiting on the target gain company meanwhile), and their slots go on. So the target
verifies every slot's draft in one pass, and the draft model drafts one position for every slot in one.

One slot runs at a time (the baton): slots share the suffix store, the metrics and llama.cpp's output
buffers, whose views a slot reads between its decode and its next one, and no decode runs until every
slot has parked again. A prompt is taken in a chunk per decode while other slots are generating, so
a long one does not stall them.

With several slots, every decode runs in one thread of the rendezvous's own: llama.cpp's CPU backend
computes a decode on an OpenMP team of the thread that calls it, and teams kept by several calling
threads slowed each decode by a third on 2 cores (RESULTS.md, *Slots*). With one slot, its own thread
is the only caller, and decodes run there without a hand-over.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import numpy as np

from speccli.llama.model import KVSequence, Model, check_decode

# Prompt tokens a slot takes in per decode while other slots generate: each of their steps waits for
# them (RESULTS.md, *Slots*).
PROMPT_CHUNK = 32

T = TypeVar("T")


@dataclass(eq=False)
class _Parked:
    sequence: KVSequence | None  # None: work to run alone (`Rendezvous.alone`)
    tokens: Sequence[int] = ()
    n_logit_rows: int = 0
    work: Callable[[], object] | None = None
    done: bool = False
    result: object = None
    error: BaseException | None = None
    taken: int = 0  # tokens already decoded (a prompt taken in by chunks)

    @property
    def model(self) -> Model | None:
        return None if self.sequence is None else self.sequence.model


@dataclass
class Rendezvous:
    """Where the slots' decodes meet. `models`: the order in which parked models decode (the draft's first)."""

    models: Sequence[Model]
    decode_thread: bool = False  # decode in a thread of its own (several slots), not the parking slot's
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _running: bool = False  # a slot holds the baton
    _runnable: int = 0  # slots that may run, waiting for the baton
    _parked: list[_Parked] = field(default_factory=list)
    _decoder: threading.Thread | None = None
    _closed: bool = False

    def enter(self) -> None:
        """A slot starts a generation: it runs once it has the baton."""
        with self._changed:
            self._runnable += 1
            self._take_baton()

    def leave(self) -> None:
        """A slot's generation ended (or failed): the baton passes on."""
        with self._changed:
            self._running = False
            self._go_on()

    def decode(self, sequence: KVSequence, tokens: Sequence[int], n_logit_rows: int) -> np.ndarray:
        return self._park(_Parked(sequence, tokens, n_logit_rows))  # type: ignore[return-value]

    def alone(self, work: Callable[[], T]) -> T:
        """Run `work` once every other slot is parked and no decode is under way (timing the costs)."""
        return self._park(_Parked(None, work=work))  # type: ignore[return-value]

    def _park(self, parked: _Parked) -> object:
        with self._changed:
            self._parked.append(parked)
            self._running = False
            self._go_on()
            while not parked.done:
                self._changed.wait()
            self._take_baton()
        if parked.error is not None:
            raise parked.error
        return parked.result

    def _take_baton(self) -> None:
        while self._running:
            self._changed.wait()
        self._running = True
        self._runnable -= 1

    def _go_on(self) -> None:
        """Under the lock, the baton just given up: to a slot that may run, else (every busy slot parked)
        run what is parked, a model's decodes at a time, until some slot may run (here, or in the
        decode thread, which the notification wakes)."""
        try:
            if self.decode_thread:
                if self._decoder is None:
                    self._decoder = threading.Thread(target=self._decode, name="speccli-decode", daemon=True)
                    self._decoder.start()
                return
            while self._due():
                self._run_parked()
        finally:
            self._changed.notify_all()

    def _due(self) -> bool:
        return not self._running and not self._runnable and bool(self._parked)

    def _decode(self) -> None:
        with self._changed:
            while not self._closed:
                if self._due():
                    try:
                        self._run_parked()
                    except BaseException as error:  # a bug: the slots waiting hear it rather than hang
                        self._finish(list(self._parked), None, error)
                    self._changed.notify_all()
                else:
                    self._changed.wait()

    def close(self) -> None:
        """End the decode thread (once no slot runs)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._decoder is not None:
            self._decoder.join()

    def _run_parked(self) -> None:
        alone = next((parked for parked in self._parked if parked.sequence is None), None)
        if alone is not None:
            self._finish([alone], lambda: [alone.work()])
            return
        model = next(model for model in self.models if any(parked.model is model for parked in self._parked))
        waiting = [parked for parked in self._parked if parked.model is model]
        parts, ending, room = [], [], model.n_batch
        others = len(waiting) > 1
        for parked in waiting:
            left = parked.tokens[parked.taken :]
            if len(left) <= room and not (others and len(left) - parked.n_logit_rows > PROMPT_CHUNK):
                parts.append((parked.sequence, left, parked.n_logit_rows))
                ending.append(parked)
                room -= len(left)
            elif len(left) > parked.n_logit_rows and room:
                # A prompt (or a catch-up) goes in by chunks, without logits, until its end fits.
                chunk = min(room, len(left) - parked.n_logit_rows, PROMPT_CHUNK if others else room)
                parts.append((parked.sequence, left[:chunk], 0))
                parked.taken += chunk
                room -= chunk
            if not room:
                break
        try:
            rows = model.decode_together(parts)
        except BaseException as error:  # every slot in the decode hears it; the caches dropped its tokens
            for parked in waiting:
                if any(part[0] is parked.sequence for part in parts):
                    self._finish([parked], None, error)
            return
        ended = {id(part[0]): row for part, row in zip(parts, rows)}
        total = sum(len(part[1]) for part in parts)
        for parked in ending:
            parked.sequence.companion_rows = total - len(parked.tokens) + parked.taken
        self._finish(ending, lambda: [ended[id(parked.sequence)] for parked in ending])

    def _finish(self, parked_list: list[_Parked], results: Callable[[], list] | None,
                error: BaseException | None = None) -> None:
        if error is None and results is not None:
            try:
                values = results()
            except BaseException as failure:
                values, error = [None] * len(parked_list), failure
        else:
            values = [None] * len(parked_list)
        for parked, value in zip(parked_list, values):
            parked.done, parked.result, parked.error = True, value, error
            self._parked.remove(parked)
            self._runnable += 1


class GatedSequence:
    """A slot's sequence of a model: decodes go through the rendezvous, the rest as the sequence's own."""

    def __init__(self, sequence: KVSequence, rendezvous: Rendezvous) -> None:
        self.sequence, self.rendezvous = sequence, rendezvous

    def __getattr__(self, name: str):  # n_past, n_ctx, tokenizer, truncate, reset, ...
        return getattr(self.sequence, name)

    def decode(self, tokens: Sequence[int], n_logit_rows: int = 1) -> np.ndarray:
        sequence = self.sequence
        sequence.last_logits = None
        check_decode(tokens, n_logit_rows, sequence.n_past, sequence.n_ctx, sequence.n_batch)
        sequence.last_logits = self.rendezvous.decode(sequence, tokens, n_logit_rows)
        return sequence.last_logits

    time_decode = KVSequence.time_decode
