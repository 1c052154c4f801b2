"""Benchmark (not a test): draft policies replayed on recorded model outputs, deterministically.

    .venv/bin/python tests/benchmarks/replay.py qwen2.5-coder-1.5b --costs 0.479:1.48,1.59,3.15,4.08 \\
        --catch-up 0.55,0.178 --recording /tmp/qwen.json --spec ngram+model,model,ngram --rounds 3

`fixed_cost_model.py` prices real runs, but `auto` still chooses from the run's own timings, so two runs
of the same code differ by more than most policy changes (a task by 10-20%). Here nothing is timed.
The models run once, to record, for each bench prompt, the target's greedy reply and, at each of its
positions, the draft model's greedy continuation with its confidences (to a few tokens past its first
miss). Then each spec's real drafters, chain and `auto` policy step through the replies (ModelDrafter
over a stand-in for the draft model that returns the recorded tokens and confidences) with their
costs fixed (c per draft-model decode, V(n) per verify of n rows, A + B*m draft decodes for a draft
model to take in m tokens it skipped while the lookup drafted, and as much for the prompt it takes in
at its first draft of a reply; catch_up_costs.py measures them, here Qwen 0.55,0.178 and Gemma
0.23,0.097): a draft is kept up to its first token that differs from the recorded reply. The same code
and costs give the same figures, in seconds.
`--prompts heldout_prompts.jsonl -n 64` records 12 prompts no version of the policy was tuned on;
`--prompts long_prompts.jsonl -n 200` 3 chat-style requests that copy their input after a sentence.
`--workload agent` (json, regenerate) records serve_workload.py's requests to their stop strings, as one
task whose figure is its requests' tokens over their cost.
Every `--spec` is replayed (`suffix` chains too): each reply starts from nothing, as in bench, or with
`--remember` as in serve: a `suffix` source keeps the earlier replies' text, and the caches the prefix
a request shares with the one before (use `--rounds 1`: a second round recalls the first's replies).
One policy is kept across the rounds, as bench keeps one across its runs; `--warmup N` first replays
the first prompt N times unmeasured, as bench's warm-up generates it (what the policy learns there
carries over). `--costs` also takes a curve timed at every size, V(1)..V(25), priced as given: on a CPU
it need not be monotone (see RESULTS.md, "At an idle machine's costs").

What it leaves out: logits depend a little on how a cache was filled (in which batches), so at a
near-tie a real run may pick the other token, the target (batched verification against the recorded
single-token reply) or the draft (on Gemma `summarize`, the first draft keeps 2 of 4 tokens here and 4
of 4 in a real run, whose draft cache kept the previous prompt's first token); the per-row work after
a verify; a draft model's tokens past the recorded depth are taken as misses with confidence 0.5.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import speccli  # noqa: F401  first: llama.cpp's library mapped before numpy (docs/gpu.md)
import numpy as np

from speccli.bench.prompts import load_prompt_set
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams, top_probability
from speccli.core.stats import StepEvent, TokenEvent
from speccli.core.seam import CostProfile, Draft, DraftCosts
from speccli.drafting.planner import Planner
from speccli.drafting.model import CATCH_UP_SIZES, ModelDrafter
from speccli.drafting.policy import AUTO_MAX_K, PROFILED_SIZES, VerifyCosts
from speccli.drafting.registry import LOOKUPS, SPECS, uses_draft_model
from speccli.drafting.specs import make_lookup, make_policy
from speccli.llama.model import LoadOptions, Model
from speccli.util.sequences import common_prefix_length
from speccli.validation import AUTO_K, K, parse_k

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pair_files import HELP as PAIR_HELP, pair_files  # noqa: E402
from serve_workload import WORKLOADS, Prompts  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PAST_FIRST_MISS = 4  # draft tokens recorded past the first that differs from the reply
MAX_DEPTH = 25
UNIT = 0.01  # seconds of a target 1-token decode, as the policy is told


@dataclass
class Reply:
    task: str
    prompt: list[int]
    tokens: list[int]  # the target's greedy reply
    drafts: list[list[tuple[int, float]]]  # at each position: the draft model's (token, confidence) continuation


def record(
    target: Model, draft: Model, prompts: Sequence[tuple[str, list[int]]], n_predict: int, stop: tuple[str, ...] = ()
) -> list[Reply]:
    """For each (task, prompt): the target's greedy reply (to `n_predict` tokens or a `stop` string) and
    the draft's continuation at each position."""
    scratch = np.empty(draft.n_vocab, dtype=np.float32)
    replies = []
    for task, prompt in prompts:
        target.reset()
        events = Generator(target, None, GREEDY).generate(prompt, GenerationLimits(max_tokens=n_predict, stop=stop))
        tokens = [event.token for event in events if isinstance(event, TokenEvent)]
        draft.reset()
        draft.decode(prompt[:-1], n_logit_rows=0)
        continuations = []
        for t in range(len(tokens)):
            context = prompt + tokens[:t]
            logits = draft.decode(context[-1:], n_logit_rows=1)  # the cache now holds the context
            continuation, missed_at = [], None
            while len(continuation) < MAX_DEPTH:
                token = int(logits[0].argmax())
                continuation.append((token, top_probability(logits[0], out=scratch)))
                position = t + len(continuation) - 1
                if missed_at is None and (position >= len(tokens) or tokens[position] != token):
                    missed_at = len(continuation)
                if missed_at is not None and len(continuation) >= missed_at + PAST_FIRST_MISS:
                    break
                logits = draft.decode([token], n_logit_rows=1)
            draft.truncate(len(context))
            continuations.append(continuation)
        replies.append(Reply(task, prompt, tokens, continuations))
    return replies


class RecordedDraftModel:
    """Stands in for the draft `Model` under the real ModelDrafter: each decode returns a logits row whose
    greedy token and top probability are the recording's, and counts what a real decode would cost.

    Its cache is the list of tokens it was given. The replay says where each step's context ends
    (`step_from`): the n-th decode that asks for logits from there is the draft's n-th token of the
    continuation recorded at that position (past the recorded depth, a miss with confidence 0.5). Token
    ids are compacted (`compact`), so a row is as wide as the ids the recording uses, not a vocabulary.
    A confidence read back from a row is the recorded one to float32 rounding (within 3e-7)."""

    n_ctx = n_batch = 1 << 30  # the recording's replies fit in both

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab  # the id n_vocab - 1 occurs nowhere in the recording: a miss
        self.held: list[int] = []
        self.reply: Reply | None = None
        self.context_length = 0
        self.decodes = 0  # decodes with logits since `step_from`: draft tokens
        self.caught_up = 0  # tokens decoded without logits since `step_from`: a catch-up

    @property
    def n_past(self) -> int:
        return len(self.held)

    def step_from(self, context_length: int) -> None:
        self.context_length, self.decodes, self.caught_up = context_length, 0, 0

    def decode(self, tokens: Sequence[int], n_logit_rows: int = 1) -> np.ndarray:
        self.held.extend(tokens)
        if not n_logit_rows:
            self.caught_up += len(tokens)
            return np.empty((0, self.n_vocab), dtype=np.float32)
        self.decodes += 1
        recorded = self.reply.drafts[self.context_length - len(self.reply.prompt)]
        depth = len(self.held) - self.context_length
        assert depth >= 0, "logits asked for before the step's context ends"
        token, confidence = recorded[depth] if depth < len(recorded) else (self.n_vocab - 1, 0.5)
        return self._logits(token, confidence)[None]

    def _logits(self, token: int, confidence: float) -> np.ndarray:
        """A row whose argmax is `token`, at probability `confidence`: the rest is spread evenly over
        enough other ids that none of them is as likely."""
        row = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        row[token] = 0.0
        if confidence < 1:
            candidates = np.arange(others_needed(confidence) + 1)
            others = candidates[candidates != token][: others_needed(confidence)]
            row[others] = np.log((1 - confidence) / confidence / len(others))
        return row

    def truncate(self, n_tokens: int) -> None:
        del self.held[n_tokens:]

    def reset(self) -> None:
        self.held = []


def schedule(replies: list[Reply], rounds: int, warmup: int) -> list[tuple[Reply, bool]]:
    """(reply, measured) in the order a bench generates them: its warm-up generates the first prompt
    `warmup` times unmeasured, then each round every prompt in turn."""
    return [(replies[0], False)] * warmup + [(reply, True) for _ in range(rounds) for reply in replies]


def others_needed(confidence: float) -> int:
    """How many other ids must share 1 - `confidence` for each to be less likely than the top token."""
    return int(np.ceil((1 - confidence) / confidence)) + 1


def compact(replies: list[Reply]) -> tuple[list[Reply], int]:
    """The replies with every token id renumbered densely (equal ids stay equal, so every lookup and
    comparison is the same), and a row width for the stand-in draft model: the ids used, then enough
    more that the least confident token recorded can be given at its confidence, then one for a miss."""
    ids: dict[int, int] = {}

    def renumber(tokens: Sequence[int]) -> list[int]:
        return [ids.setdefault(token, len(ids)) for token in tokens]

    def renumber_draft(draft: list[tuple[int, float]]) -> list[tuple[int, float]]:
        return [(ids.setdefault(token, len(ids)), confidence) for token, confidence in draft]

    compacted = [
        Reply(reply.task, renumber(reply.prompt), renumber(reply.tokens), [renumber_draft(d) for d in reply.drafts])
        for reply in replies
    ]
    lowest = min((confidence for reply in replies for draft in reply.drafts for _, confidence in draft), default=1.0)
    return compacted, len(ids) + others_needed(lowest) + 1


def replay(
    replies: list[Reply],
    spec: str,
    k: K,
    rounds: int,
    c: float,
    verify: VerifyCosts | MeasuredCurve,
    trace: Sequence[str] = (),
    catch_up: tuple[float, float] = (0.0, 0.0),
    warmup: int = 0,
    host: tuple[float, float] = (0.0, 0.0),
    remember: bool = False,
    draft_first: float = 0.0,
    max_tokens: int = 0,
) -> dict[str, list[float]]:
    """Tokens per unit of cost (target 1-token decodes) of each task's replies, by round, over `rounds` rounds,
    after `warmup` unmeasured replays of the first reply; K chosen per step where `k` is 'auto'. A draft
    model's catch-up of m tokens costs A + B * m draft decodes, `catch_up` = (A, B). The host's own work,
    `host` = (per row, per step) in target 1-token decodes, is added to each step (a row for each row
    the target verifies and each token a draft model draws), as to the target alone's tokens: the
    speedup is over the target alone with its host time. A draft model's deferred intake of a prompt
    costs as a catch-up of its tokens does, counted in the reply's cost (as the prefill's, not the step's,
    which the policy learns from). `remember`: as serve, a `suffix` source keeps what earlier replies said
    (in order, the warm-up's and earlier rounds' included) and the caches keep the prefix a prompt shares
    with the one before it and its reply. `max_tokens`: the reply's limit, as a request's max_tokens
    (a recorded reply may end sooner, at a stop string); 0: each reply's own length.
    `draft_first`: what a draft model's first decode of each draft costs more than the others, in target
    1-token decodes (on the H200 its caches or graphs are cold after the target's verify: docs/gpu.md)."""
    host_row, host_step = host
    replies, n_vocab = compact(replies)
    model = RecordedDraftModel(n_vocab)

    def catch_up_decodes(tokens: int) -> float:
        return catch_up[0] + catch_up[1] * tokens if tokens else 0.0

    # The real sources, the draft model's over the stand-in (the lookups need no model).
    lookup = next((make_lookup(name) for name in spec.split("+") if name in LOOKUPS), None)
    drafter = Planner(lookup, ModelDrafter(model) if uses_draft_model(spec) else None)
    policy = make_policy(k)
    catch_up_seconds = {n: catch_up_decodes(n) * c * UNIT for n in CATCH_UP_SIZES}
    draft_costs = {"model": DraftCosts(c * UNIT, catch_up_seconds)} if uses_draft_model(spec) else {}
    policy.calibrate(CostProfile({n: verify.decode(n) * UNIT for n in (1, *PROFILED_SIZES)}, draft_costs))
    rng = np.random.default_rng(0)
    totals: dict[tuple[str, int], list[float]] = {}  # (task, measured reply index // tasks): [tokens, cost]
    held: list[int] = []
    for index, (reply, measured) in enumerate(schedule(replies, rounds, warmup)):
        model.reply = reply
        policy.begin_reply()
        # As bench, each reply from nothing (a `suffix` source's store too), or as serve, from what
        # earlier replies left in its store and caches (`remember`).
        if remember:
            drafter.forget(common_prefix_length(held, reply.prompt[:-1]))
        else:
            drafter.forget_all()
        drafter.sync(reply.prompt)
        context, cost, t, steps = list(reply.prompt), 0.0, 0, []
        while t < len(reply.tokens):
            limit = (max_tokens or len(reply.tokens)) - t - 1
            model.step_from(len(context))
            draft = Draft()
            if limit > 0:
                draft = drafter.draft(context, limit, GREEDY, rng, policy)
            proposed = draft.tokens
            truth = reply.tokens[t:]
            accepted = common_prefix_length(proposed, truth)  # truth is longer: the rest of the reply
            new_tokens = truth[: accepted + 1]
            # The prompt a draft model took in at its first draft: one decode before the catch-up's.
            intake_cost = catch_up_decodes(draft.prompt_tokens) * c
            catch_up_cost = catch_up_decodes(model.caught_up - draft.prompt_tokens)
            step = StepEvent(
                drafted=len(proposed), accepted=accepted,
                draft_seconds=((model.decodes + catch_up_cost) * c + model.decodes * host_row
                               + (draft_first if model.decodes else 0.0)) * UNIT,
                target_seconds=verify.decode(len(proposed) + 1) * UNIT,
                other_seconds=((len(proposed) + 1) * host_row + host_step) * UNIT, source=draft.source or None,
                catch_up_seconds=catch_up_cost * c * UNIT,
                continuation=(draft.continuation.source, len(draft.continuation.tokens)) if draft.continuation else None,
            )
            drafter.observe(draft, step, new_tokens, policy)
            cost += (step.draft_seconds + step.target_seconds + step.other_seconds) / UNIT + intake_cost
            steps.append(step_text(step))
            context += new_tokens
            drafter.forget(len(context) - 1)
            t += len(new_tokens)
        held = context[:-1] if remember else []
        if measured:
            speedup = len(reply.tokens) * (1 + host_row + host_step) / cost
            total = totals.setdefault((reply.task, (index - warmup) // len(replies)), [0.0, 0.0])
            total[0] += len(reply.tokens) * (1 + host_row + host_step)
            total[1] += cost
            if reply.task in trace:
                print(f"{spec} {k} {reply.task} {speedup:.2f}x: {' '.join(steps)}")
    speedups: dict[str, list[float]] = {}
    for (task, _), (tokens, cost) in totals.items():
        speedups.setdefault(task, []).append(tokens / cost)
    return speedups


@dataclass
class MeasuredCurve:
    """V(n) timed at every size a verify can have, priced exactly as given: a CPU's curve need not be
    monotone (VerifyCosts, the policy's estimate, interpolates and keeps its curve non-decreasing)."""

    values: list[float]  # V(1) .. V(AUTO_MAX_K + 1)

    def decode(self, n: int) -> float:
        return self.values[n - 1]


def parse_costs(text: str) -> tuple[float, VerifyCosts | MeasuredCurve]:
    """"C:V2,V4,V8,V16" (target 1-token decodes) -> c, and V(n) through those points; or "C:V1,..,V25",
    a curve timed at every size."""
    every_size = AUTO_MAX_K + 1
    c_text, colon, v_text = text.partition(":")
    if not colon:
        raise ValueError(f"expected C:V2,V4,V8,V16 or C:V1,..,V{every_size}, got {text!r}")
    values = [float(value) for value in v_text.split(",")]
    if len(values) == every_size:
        if values[0] != 1.0:
            raise ValueError(f"V1 is the unit (1), got {values[0]}")
        return float(c_text), MeasuredCurve(values)
    if len(values) != 4:
        raise ValueError(f"expected V2,V4,V8,V16 or V1..V{every_size} after the colon, got {len(values)} values")
    return float(c_text), VerifyCosts({1: 1.0, **dict(zip((2, 4, 8, 16), values))})


def step_text(step: StepEvent) -> str:
    """"m5/3(+2)": a model draft of 5 tokens, 3 kept, its last 2 the lookup's; "-0/0": a plain step."""
    taken_over = f"(+{step.continuation[1]})" if step.continuation else ""
    return f"{(step.source or '-')[0]}{step.drafted}/{step.accepted}{taken_over}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pair", help=PAIR_HELP)
    parser.add_argument(
        "--costs", required=True, help="C:V2,V4,V8,V16 (or C:V1,..,V25) in target 1-token decodes"
    )
    parser.add_argument("--recording", type=Path, required=True, help="JSON file: written if missing, else replayed")
    parser.add_argument("--spec", default="ngram+model,model,ngram", help=f"comma list of: {', '.join(SPECS)}")
    parser.add_argument(
        "--remember", action="store_true", help="a suffix source keeps earlier replies' text across replies, as in serve"
    )
    parser.add_argument("--k", default="auto", help="comma list of K: auto or a number (each with each spec)")
    parser.add_argument(
        "--catch-up", required=True, help="A,B: a draft model taking in m tokens it skipped costs A + B*m draft decodes"
    )
    parser.add_argument(
        "--host", default="0,0", help="ROW,STEP: the host's own work per target or draft row and per step, in "
        "target 1-token decodes (tests/benchmarks/loop_overhead.py measures it in µs)"
    )
    parser.add_argument(
        "--draft-first", type=float, default=0.0,
        help="what a draft model's first decode of each draft costs more than the others, in target 1-token decodes",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--warmup", type=int, default=0, help="unmeasured replays of the first prompt first, as bench's warm-up"
    )
    parser.add_argument("-n", "--n-predict", type=int, default=48)
    parser.add_argument("--trace", default="", help="tasks whose steps to print (m: model, n: lookup, drafted/kept)")
    parser.add_argument("--prompts", type=Path, help="prompts to record where --recording is missing (bench's format)")
    parser.add_argument(
        "--workload", choices=WORKLOADS, help="record a serve_workload.py workload's requests instead (to its stop strings)"
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.warmup < 0:
        parser.error(f"--rounds must be >= 1 and --warmup >= 0, got {args.rounds} and {args.warmup}")
    try:  # before a missing recording is made: that loads both models
        c, verify = parse_costs(args.costs)
    except ValueError as error:
        parser.error(f"--costs: {error}")
    if unknown := [spec for spec in args.spec.split(",") if spec not in SPECS]:
        parser.error(f"--spec: unknown {', '.join(map(repr, unknown))}; expected some of {', '.join(SPECS)}")
    if not args.recording.exists():
        files = pair_files(args.pair)
        options = LoadOptions(n_ctx=2048)
        with Model(files.target_path, options) as target, Model(files.draft_path, options) as draft:
            stop: tuple[str, ...] = ()
            if args.workload:  # one task: its requests' figures are summed, as serve_workload's are
                chat = Prompts(files.target_path)
                prompts = [(args.workload, chat.ids(request["messages"])) for request in WORKLOADS[args.workload]()]
                stop = tuple(chat.format.stop)
            else:
                prompt_set = load_prompt_set(args.prompts)  # the built-in set where none is given
                prompts = [(p.task, target.tokenizer.tokenize(p.prompt)) for p in prompt_set.prompts]
            replies = record(target, draft, prompts, args.n_predict, stop)
        args.recording.write_text(json.dumps([reply.__dict__ for reply in replies]))
    replies = [Reply(**fields) for fields in json.loads(args.recording.read_text())]
    catch_up = tuple(map(float, args.catch_up.split(",")))
    ks = [parse_k(k) for k in args.k.split(",")]
    if isinstance(verify, MeasuredCurve) and max((k for k in ks if k != AUTO_K), default=0) > AUTO_MAX_K:
        parser.error(f"--k: a curve timed at V1..V{AUTO_MAX_K + 1} prices drafts of at most {AUTO_MAX_K} tokens")
    configurations = [(spec, k) for spec in args.spec.split(",") for k in ks]
    results = {}
    for spec, k in configurations:
        results[f"{spec} {k}"] = replay(
            replies, spec, k, args.rounds, c, verify, args.trace.split(","), catch_up, args.warmup,
            tuple(map(float, args.host.split(","))), args.remember, args.draft_first, args.n_predict,
        )
    labels = list(results)
    tasks = list(results[labels[0]])
    width = max(10, *(len(task) + 1 for task in tasks))  # a prompt file's task names may be longer
    column = max(15, *(len(label) + 2 for label in labels))  # "suffix+model auto" ran into its neighbour
    print(f"{'task':<{width}}" + "".join(f"{label:>{column}}" for label in labels))
    for task in tasks:
        print(f"{task:<{width}}" + "".join(f"{statistics.mean(results[label][task]):>{column - 1}.3f}x" for label in labels))
    means = [statistics.geometric_mean([statistics.mean(results[label][task]) for task in tasks]) for label in labels]
    print(f"{'geomean':<{width}}" + "".join(f"{mean:>{column - 1}.3f}x" for mean in means))


if __name__ == "__main__":
    main()
