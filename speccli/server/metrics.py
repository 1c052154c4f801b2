"""Server-wide counters and their Prometheus text exposition (format 0.0.4), written by hand: a few
counters and gauges do not need a client library.

Everything speculative comes from the generations' own RunStats, added up (`RunStats.__add__`): the
same figures chat and bench report, so /metrics and the per-response `speculative` objects agree.
"""
from __future__ import annotations

import threading
from collections import Counter

from speccli.core.stats import RunStats

PREFIX = "speccli"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # the worker thread writes, request handlers read
        self._totals = RunStats()
        self._requests: Counter[str] = Counter()  # by outcome
        self._waiting = 0
        self._worker = None  # its slots and models, read as /metrics is asked
        self._queue_wait = [0.0, 0]  # seconds waited before a slot took the request, and how many did
        self._first_token = [0.0, 0]  # seconds from arrival to the first token, and how many got one

    def watch(self, worker) -> None:
        self._worker = worker

    def started(self, waited: float) -> None:
        with self._lock:
            self._queue_wait[0] += waited
            self._queue_wait[1] += 1

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self._first_token[0] += seconds
            self._first_token[1] += 1

    def record(self, stats: RunStats | None, outcome: str) -> None:
        """A request ended: "completed", "cancelled" (client left), "error", "rejected" (any 4xx),
        "queue_full" (503). `stats`: what its generation did, if it ran."""
        with self._lock:
            self._requests[outcome] += 1
            if stats is not None:
                self._totals = self._totals + stats

    def set_waiting(self, count: int) -> None:
        with self._lock:
            self._waiting = count

    def render(self) -> str:
        with self._lock:
            totals, requests, waiting = self._totals, dict(self._requests), self._waiting
            queue_wait, first_token = list(self._queue_wait), list(self._first_token)
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {PREFIX}_{name} {help_text}")
            lines.append(f"# TYPE {PREFIX}_{name} {kind}")
            for labels, value in samples:
                lines.append(f"{PREFIX}_{name}{labels} {value:g}" if isinstance(value, float) else f"{PREFIX}_{name}{labels} {value}")

        outcomes = ("completed", "cancelled", "error", "rejected", "queue_full")
        metric("requests_total", "counter", "Requests by outcome (rejected: any 4xx answer).",
               [(f'{{outcome="{o}"}}', requests.get(o, 0)) for o in outcomes])
        metric("queue_waiting", "gauge", "Requests not yet running: being read (tokenized, a grammar compiled) or waiting for a slot.", [("", waiting)])
        worker = self._worker
        if worker is not None:
            metric("slots", "gauge", "Generation slots (--parallel).", [("", len(worker.slots))])
            metric("slots_busy", "gauge", "Slots running a generation now.", [("", len(worker.running))])
            models = [("target", worker.target), *([("draft", worker.draft)] if worker.draft is not None else [])]
            metric("llama_decodes_total", "counter", "llama_decode calls, each taking the rows of every slot ready.",
                   [(f'{{model="{role}"}}', model.decodes) for role, model in models])
            metric("llama_decode_rows_total", "counter", "Tokens those decodes took (rows per decode: divide).",
                   [(f'{{model="{role}"}}', model.decoded_rows) for role, model in models])
        for name, (seconds, count), help_text in (
            ("queue_wait_seconds", queue_wait, "From arrival to a slot taking the request."),
            ("time_to_first_token_seconds", first_token, "From arrival to the first token."),
        ):
            lines.append(f"# HELP {PREFIX}_{name} {help_text}")
            lines.append(f"# TYPE {PREFIX}_{name} summary")
            lines.append(f"{PREFIX}_{name}_sum {seconds:g}")
            lines.append(f"{PREFIX}_{name}_count {count}")
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished generations.", [("", totals.prompt_tokens)])
        metric("tokens_generated_total", "counter", "Tokens generated (end-of-generation tokens not counted).",
               [("", totals.generated)])
        metric("target_decodes_total", "counter", "Target decodes (verification steps).", [("", totals.steps)])
        # By source only: an unlabeled total beside the sources' series would count twice in a sum().
        metric("draft_tokens_total", "counter", "Draft tokens proposed, by source.",
               [(f'{{source="{s}"}}', c.drafted) for s, c in sorted(totals.by_source.items())])
        metric("draft_tokens_accepted_total", "counter", "Draft tokens the target accepted, by source.",
               [(f'{{source="{s}"}}', c.accepted) for s, c in sorted(totals.by_source.items())])
        metric("acceptance_rate", "gauge", "Accepted / drafted draft tokens, all requests so far.",
               [("", float(totals.acceptance_rate))])
        positions = totals.positions
        metric("draft_position_drafted_total", "counter", "Steps that drafted a token at this position (1-based).",
               [(f'{{position="{i + 1}"}}', n) for i, n in enumerate(positions.drafted_at)])
        metric("draft_position_accepted_total", "counter", "Steps that kept the drafted token at this position.",
               [(f'{{position="{i + 1}"}}', n) for i, n in enumerate(positions.accepted_at)])
        metric("acceptance_by_position", "gauge", "Share of steps drafting this position that kept it.",
               [(f'{{position="{i + 1}"}}', float(r)) for i, r in enumerate(totals.acceptance_by_position())])
        metric("k_chosen_total", "counter", "Steps by draft length chosen (the K; 0: nothing drafted).",
               [(f'{{k="{k}"}}', n) for k, n in sorted(totals.draft_lengths.items())])
        metric("take_overs_total", "counter", "Steps in which a source took a costlier source's draft over.",
               [(f'{{source="{s}"}}', n) for s, n in sorted(totals.take_overs.items())])
        metric("decode_seconds_total", "counter", "Seconds spent in decode steps (prefill excluded).",
               [("", float(totals.decode_seconds))])
        metric("draft_seconds_total", "counter", "Of decode_seconds_total: drafting (draft-model decodes, lookups).",
               [("", float(totals.draft_seconds))])
        metric("draft_catch_up_seconds_total", "counter",
               "Of draft_seconds_total: a draft model taking in tokens it skipped while other sources drafted.",
               [("", float(totals.catch_up_seconds))])
        metric("target_seconds_total", "counter", "Of decode_seconds_total: target decodes (verification).",
               [("", float(totals.target_seconds))])
        metric("prefill_seconds_total", "counter", "Seconds spent reading prompts into the caches.",
               [("", float(totals.prefill_seconds))])
        metric("tokens_per_second", "gauge", "Decode speed over all requests: tokens generated / decode seconds.",
               [("", float(totals.tokens_per_second))])
        return "\n".join(lines) + "\n"
