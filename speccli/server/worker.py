"""The slots that run generations, and the bounded queue of jobs they take, in order of arrival.

Each slot (`--parallel`) is a thread with its own sequence of each model's KV cache; llama.cpp blocks,
so generations run there and never on the event loop, and their decodes meet in one llama_decode
(`slots.py`). A waiting job goes to the idle slot whose cache shares most of its prompt, as
llama-server's slot similarity does. Each job hands its events back to the request that asked for it
through that request's asyncio queue. A job is cancelled by setting its flag: it is checked between
the Generator's events (never inside a decode, which would leave cache and bookkeeping disagreeing).
A job whose client leaves while it still waits gives its place in the queue up at once (`cancel`).

A slot keeps a generator per drafting configuration (spec and k, or none), so an auto-K policy keeps
what it learned. They share the slot's sequences, so switching configurations resets the one taken
up; a request on the slot's configuration reuses the longest common token prefix.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from contextlib import closing
from dataclasses import dataclass, field

import numpy as np

from speccli.core.generator import GenerationLimits, Generator, PairCosts
from speccli.core.sampling import SamplingParams
from speccli.core.stats import DoneEvent, TokenEvent
from speccli.drafting.specs import make_drafter, make_policy
from speccli.drafting.suffix import SuffixStore
from speccli.remembered.learnt import LearntFile
from speccli.errors import SpeccliError
from speccli.llama.model import Model, naming_non_finite_logits
from speccli.server.metrics import Metrics
from speccli.server.slots import GatedSequence, Rendezvous
from speccli.util.sequences import common_prefix_length
from speccli.validation import K

log = logging.getLogger("speccli.server")


class QueueFullError(Exception):
    """Every place in the queue is taken: the request is refused (503) rather than kept waiting."""


class LostError(Exception):
    """The models cannot run any more; the message says why."""


class ShuttingDownError(Exception):
    """The worker has stopped: a request that arrives as the server shuts down is refused (503)."""


@dataclass(frozen=True)
class Speculation:
    spec: str | None  # None: the target alone
    k: K | None  # None only for the target alone, which drafts nothing


@dataclass
class Job:
    prompt: list[int]
    limits: GenerationLimits
    sampling: SamplingParams
    seed: int | None
    speculation: Speculation
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # TokenEvent, DoneEvent, Started or an error
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)  # as the request's body was read

    def emit(self, item: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shutting down): nobody to tell
            self.cancelled.set()


@dataclass(frozen=True)
class Started:
    """The job left the queue; `cached_tokens` of its prompt were already in the KV cache."""

    cached_tokens: int


class GenerationError(Exception):
    """A generation failed part-way, or never ran, for a reason the message says; `status` is the
    HTTP status a reply not yet begun gets for it."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


SHUTTING_DOWN = "the server is shutting down; the request was not completed"


class StoppedGeneration(GenerationError):
    """The server shut down while the job ran or waited (503)."""

    def __init__(self) -> None:
        super().__init__(SHUTTING_DOWN, status=503)


class LostGeneration(GenerationError):
    """The models could not run any more while the job ran or waited (503); the message says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, status=503)


@dataclass(eq=False)
class Slot:
    """One generation at a time, in its own sequence of each model's cache."""

    index: int
    target: GatedSequence
    draft: GatedSequence | None
    generators: dict[Speculation, Generator] = field(default_factory=dict)
    active: Speculation | None = None  # whose tokens its sequences hold
    job: Job | None = None
    thread: threading.Thread | None = None
    last_used: int = 0  # when it last took a job (a count): of slots that hold as much, the least recent

    def cached_tokens(self, job: Job) -> int:
        """What a job's prompt would find in this slot's cache, where that is more than a tenth of it
        (llama-server's --slot-prompt-similarity: a shared template's first tokens do not count), and
        the slot runs the job's configuration (another's would be reset)."""
        if self.active != job.speculation:
            return 0
        shared = common_prefix_length(self.generators[self.active].tokens, job.prompt)
        return shared if shared > len(job.prompt) // 10 else 0


class Worker:
    def __init__(self, target: Model, draft: Model | None, max_waiting: int, metrics: Metrics,
                 store: SuffixStore | None = None, learnt: LearntFile | None = None) -> None:
        self.target = target
        self.draft = draft
        # Earlier replies, shared by every request's `suffix` source for the life of the process (and
        # kept on disk with --remember); a switch of configuration starts a new conversation, not a new store.
        self.store = SuffixStore() if store is None else store
        # What `auto` learnt in earlier processes, taken up by each configuration's policy as it starts.
        self.learnt = learnt
        self.metrics = metrics
        self.max_waiting = max_waiting
        self._waiting: deque[Job] = deque()  # in order; a job leaves it when it starts or its client leaves
        self._admitted = 0  # places taken by requests still being tokenized
        self._changed = threading.Condition()  # guards _waiting, _stopping and the slots' jobs
        self._stopping = False
        # One slot per sequence the target was loaded with (serve's --parallel).
        self.rendezvous = Rendezvous([model for model in (draft, target) if model is not None],
                                     decode_thread=target.n_seq > 1)
        self.slots = [
            Slot(i, GatedSequence(target.sequence(i), self.rendezvous),
                 None if draft is None else GatedSequence(draft.sequence(i), self.rendezvous))
            for i in range(target.n_seq)
        ]
        self._jobs_taken = 0
        metrics.watch(self)
        self.costs: PairCosts | None = None  # the pair's one cost profile, for every configuration's `auto`
        self.lost: str | None = None  # why the models cannot run any more (an RPC server went away)

    @property
    def running(self) -> list[Job]:
        return [slot.job for slot in self.slots if slot.job is not None]

    def start(self) -> None:
        for slot in self.slots:
            slot.thread = threading.Thread(target=self._serve, args=(slot,), name=f"speccli-slot-{slot.index}", daemon=True)
            slot.thread.start()

    def stop(self) -> None:
        """Cancel what runs and waits, telling each its client why (503), and wait for the threads
        (models may be closed afterwards)."""
        with self._changed:
            self._stopping = True
            for job in [*self.running, *self._waiting]:
                job.cancelled.set()
                job.emit(StoppedGeneration())
            for _ in self._waiting:  # the running ones are counted where they stop
                self.metrics.record(None, "cancelled")
            self._waiting.clear()
            self._count_waiting()  # those still being tokenized are refused as they submit
            self._changed.notify_all()
        if self.lost is None:  # once lost, they never return
            for slot in self.slots:
                if slot.thread is not None and slot.thread.is_alive():
                    slot.thread.join()
            self.rendezvous.close()
        self.store.close()
        if self.learnt is not None:
            for slot in self.slots:
                for generator in slot.generators.values():
                    self.learnt.keep(generator.policy, generator.sampling, now=True, costs=generator.costs)

    @property
    def stopping(self) -> bool:
        return self._stopping and self.lost is None  # stopped (or stopping) for good, not for a lost server

    def lose(self, reason: str) -> None:
        """The models cannot run any more (an RPC server went away, and ggml's thread is parked where it
        failed, holding a slot's thread): the running and waiting jobs end with `reason` as a 503,
        and so does every later one; /health says it."""
        with self._changed:
            self.lost = reason
            self._stopping = True
            for job in [*self.running, *self._waiting]:
                job.cancelled.set()
                job.emit(LostGeneration(reason))
                self.metrics.record(None, "error")
            self._waiting.clear()
            self._count_waiting()  # those still being tokenized are refused as they submit

    def admit(self) -> None:
        """Take a place in the queue for a request about to be tokenized, so that --queue bounds the
        prompts being tokenized too (a prompt of millions of tokens costs hundreds of MB until it is
        refused); `submit` then fills the place, or `withdraw` gives it back."""
        with self._changed:
            self._refuse_if_ended()
            # A job runs in each slot and max_waiting wait; one waiting while a slot is idle is about to run.
            if self._admitted + len(self._waiting) + len(self.running) >= self.max_waiting + len(self.slots):
                raise QueueFullError
            self._admitted += 1
            self._count_waiting()

    def withdraw(self) -> None:
        with self._changed:
            self._admitted -= 1
            self._count_waiting()

    def _count_waiting(self) -> None:
        self.metrics.set_waiting(self._admitted + len(self._waiting))  # under the lock

    def submit(self, job: Job) -> None:
        """Queue `job` in the place `admit` took for it."""
        with self._changed:
            self._admitted -= 1
            try:
                self._refuse_if_ended()
                self._waiting.append(job)
                self._changed.notify_all()
            finally:
                self._count_waiting()

    def _refuse_if_ended(self) -> None:
        if self.lost is not None:
            self.metrics.record(None, "error")
            raise LostError(self.lost)
        if self._stopping:  # it would wait for a worker that has ended
            self.metrics.record(None, "cancelled")
            raise ShuttingDownError

    def cancel(self, job: Job) -> None:
        """The client left: stop the job where it runs, or give up its place where it waits."""
        job.cancelled.set()
        with self._changed:
            if job in self._waiting:
                self._waiting.remove(job)
                self._count_waiting()
                self.metrics.record(None, "cancelled")

    def _next_job(self, slot: Slot) -> Job | None:
        """The longest-waiting job, now running in `slot`, once there is one and, of the idle slots,
        `slot` holds most of its prompt (of those that hold as much, the least recently used, whose
        cache is the least likely to be asked for again); None once the worker stops."""
        with self._changed:
            while not self._stopping:
                if self._waiting:
                    job = self._waiting[0]
                    idle = [other for other in self.slots if other.job is None]
                    if max(idle, key=lambda other: (other.cached_tokens(job), -other.last_used)) is slot:
                        slot.job = self._waiting.popleft()  # under the lock: `stop` sees it either way
                        self._jobs_taken += 1
                        slot.last_used = self._jobs_taken
                        self._count_waiting()
                        self._changed.notify_all()  # the next job may be another idle slot's
                        return job
                self._changed.wait()
            return None

    def _serve(self, slot: Slot) -> None:
        while (job := self._next_job(slot)) is not None:
            self.metrics.started(time.perf_counter() - job.arrived)
            self.rendezvous.enter()
            try:
                if job.cancelled.is_set():  # its event loop went away (Job.emit) while it waited
                    self.metrics.record(None, "cancelled")
                    continue
                self._run(slot, job)
            except SpeccliError as error:  # e.g. the context filled: the caller hears why
                slot.active = None  # the caches may hold part of a failed decode: start clean
                self.metrics.record(None, "error")
                job.emit(GenerationError(str(error)))
            except Exception as error:  # a bug: say so, keep serving
                log.exception("generation failed")
                slot.active = None
                self.metrics.record(None, "error")
                job.emit(GenerationError(f"internal error: {type(error).__name__}: {error}"))
            finally:
                self.rendezvous.leave()
                with self._changed:
                    slot.job = None
                    self._changed.notify_all()

    def _generator_for(self, slot: Slot, speculation: Speculation, sampling: SamplingParams) -> Generator:
        generator = slot.generators.get(speculation)
        if generator is None:
            drafter = None if speculation.spec is None else make_drafter(speculation.spec, slot.draft, slot.target, self.store)
            policy = None if speculation.k is None else make_policy(speculation.k)
            if self.costs is None and policy is not None and policy.needs_costs:  # the draft model's, whatever the spec
                self.costs = SlotCosts(self.target, self.draft, self.rendezvous)
            generator = Generator(slot.target, drafter, SamplingParams(), policy, costs=self.costs)
            if self.learnt is not None:
                self.learnt.recall(policy, sampling, generator.costs)
            slot.generators[speculation] = generator
        if slot.active != speculation:
            # Another configuration's generator moved the caches: this one's record of them is stale.
            # That one is reset too, which frees what it held for drafting (a lookup's index, a draft
            # model's K rows of the vocabulary): a generator is kept for each configuration clients ask
            # for, K from 1 to 64 with each spec.
            if slot.active in slot.generators:
                slot.generators[slot.active].reset()
            generator.reset()
            slot.active = speculation
        return generator

    def _run(self, slot: Slot, job: Job) -> None:
        def naming():  # no paths to clients
            return naming_non_finite_logits(slot.target, slot.draft, lambda model: model.path.name)

        with naming():  # the cost profile samples from the target's logits
            generator = self._generator_for(slot, job.speculation, job.sampling)
        generator.sampling = job.sampling
        generator.rng = np.random.default_rng(job.seed)
        job.emit(Started(generator.reused_prefix(job.prompt)))
        first = True
        with naming(), closing(generator.generate(job.prompt, job.limits, job.cancelled.is_set)) as events:
            for event in events:
                if job.cancelled.is_set():
                    self.metrics.record(generator.reply_stats, "cancelled")
                    return
                if isinstance(event, TokenEvent):
                    if first:
                        self.metrics.first_token(time.perf_counter() - job.arrived)
                        first = False
                    job.emit(event)
                elif isinstance(event, DoneEvent):
                    self.metrics.record(event.stats, "completed")
                    job.emit(event)
                    self.store.persist()
                    if self.learnt is not None:
                        self.learnt.keep(generator.policy, job.sampling, costs=generator.costs)
                    return
        self.metrics.record(generator.reply_stats, "cancelled")  # no DoneEvent: cancelled in its prefill


class SlotCosts(PairCosts):
    """The pair's cost profile, timed while no other decode runs (each timing is one decode's, not a
    batch's), at the end of the slot whose sequences hold the least (every size fits there)."""

    def __init__(self, target: Model, draft: Model | None, rendezvous: Rendezvous) -> None:
        super().__init__(target.sequence(0), None)
        self.models, self.rendezvous = (target, draft), rendezvous

    def profile(self, context, sizes, sampling):
        if not self.due(sizes):  # timed already, or remembered: no need to stop the other slots
            return self.measured

        def timed():
            target, draft = self.models
            emptiest = min(range(target.n_seq), key=lambda i: target.sequence(i).n_past)
            self.target = target.sequence(emptiest)
            self.drafter = None if draft is None else make_drafter("model", draft.sequence(emptiest), self.target)
            return PairCosts.profile(self, context, sizes, sampling)

        return self.rendezvous.alone(timed)
