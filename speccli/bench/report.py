"""The bench report's types: every part of `speccli bench --json`, and its JSON Schema, generated from
them. Renderers and `--compare` read these types; dicts exist only at the JSON edge.

Times have two meanings here, and their names say which:
* `stats` (a `speccli.core.stats.RunStats`) holds per-step timer sums: draft, target and "other"
  (sampling, the verify rule, bookkeeping) inside each step;
* `decode_wall_seconds` is wall-clock time around the whole decode phase (all of `generate()` after
  prefill), so it also holds what happens between steps (turning tokens into text, the event loop).
  Bench's tokens/s and speedups use the wall-clock figure: it is what a user waits for.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, GetPydanticSchema, computed_field
from pydantic_core import core_schema

from speccli.core.stats import RunStats
from speccli.validation import AUTO_K, K

# 1: reports before the typed report (no `stats`, wall and timer times mixed); 2: one model draft source,
# fixed K only; 3: draft sources and auto K (a result is a configuration: spec and K); 4: a draft model's
# catch-up time and the steps a source took another's draft over; 5: `stopped`, a run an interrupt ended
# early, reported from the rounds it finished (a version-4 report reads as one that ran to its end); 6: the
# host's time per target row and per step (a version-5 report reads as one that did not measure it); 7: the
# time a draft model took to take in the prompt at its first draft (a version-6 report reads as one without it).
SCHEMA_VERSION = 7
KIND = "speccli-bench"


class Part(BaseModel):
    # Every field is written, so the generated schema requires every field.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


def _k_from_json(value: int | None) -> K:
    return AUTO_K if value is None else value


def _k_to_json(k: K) -> int | None:
    return None if k == AUTO_K else k


def _k_schema(_source: Any, _handler: Any) -> core_schema.CoreSchema:
    json_k = core_schema.nullable_schema(core_schema.int_schema())
    return core_schema.json_or_python_schema(
        json_schema=core_schema.no_info_after_validator_function(_k_from_json, json_k),
        python_schema=core_schema.union_schema([core_schema.literal_schema([AUTO_K]), core_schema.int_schema(strict=True)]),
        serialization=core_schema.plain_serializer_function_ser_schema(_k_to_json, return_schema=json_k, when_used="json"),
    )


# K in the report: a `speccli.validation.K` in Python; in the JSON an integer, or null for auto (as every
# report since schema version 3 writes it).
ReportK = Annotated[K, GetPydanticSchema(_k_schema)]


# --- one generation ----------------------------------------------------------------------------------


class Measurement(Part):
    """One generation: the target alone (mode "target", spec None, k 0) or speculative (mode
    "speculative", its draft source and K; k None: auto, chosen per step)."""

    task: str
    prompt_index: int
    run: int  # negative for warm-up runs (never reported)
    mode: Literal["target", "speculative"]
    spec: str | None
    k: ReportK
    seed: int
    reason: str  # why generation ended: "eog", "max_tokens", ...
    decode_wall_seconds: float  # wall-clock time of the decode phase (everything after prefill)
    stats: RunStats  # the engine's figures: per-step timer sums, per-position counts

    @computed_field
    @property
    def wall_tokens_per_second(self) -> float:
        """Generated tokens / decode_wall_seconds."""
        return self.stats.generated / self.decode_wall_seconds if self.decode_wall_seconds > 0 else 0.0


# --- figures over many generations -----------------------------------------------------------------------


class Spread(Part):
    median: float
    min: float
    max: float


class TimeSplit(Part):
    """Where the decode phase's wall-clock time went: the per-step timers, and the rest ("between
    steps"). Fractions are of the wall-clock time and add up to 1; catch-up is a part of drafting."""

    draft_seconds: float
    catch_up_seconds: float  # of draft_seconds: a draft model taking in tokens it skipped
    target_seconds: float
    other_seconds: float
    between_steps_seconds: float
    draft_fraction: float
    catch_up_fraction: float
    target_fraction: float
    other_fraction: float
    between_steps_fraction: float
    # The host's own time: the wall-clock time less what llama.cpp's decode took (both models), per row of
    # the target's logits the steps asked for and per step, in µs. None in a report from before they were measured.
    host_us_per_row: float | None = None
    host_us_per_step: float | None = None
    # A draft model taking in the prompt at its first draft: timed with the prefill, so outside the
    # wall-clock time the fractions are of; its fraction is of that time all the same. None in a report
    # from before it was measured.
    draft_prompt_seconds: float | None = None
    draft_prompt_fraction: float | None = None


class SideSummary(Part):
    """One side (target alone, or speculative at one K) over some rounds."""

    wall_tokens_per_second: Spread | None  # decode phase, wall-clock, each run from its own token count
    prefill_seconds: Spread | None
    tokens: int
    tokens_per_run: list[int]
    stop_reasons: list[str]
    time_split: TimeSplit


class Prediction(Part):
    """The speedup theory predicts from measured alpha, c and v (Leviathan et al. 2023, sec. 3.4)."""

    alpha: float
    tokens_per_verify: float  # E(alpha, K), the correction/bonus token included
    step_cost: float  # K*c + v(K+1), in target 1-token decodes
    speedup: float


class ObservedCosts(Part):
    """c and v as the runs' own per-step timers saw them, and the prediction from those (fixed K with
    a model draft only)."""

    c: float  # seconds per drafted token / target 1-token decode (near 0 for n-gram lookup)
    verify_relative_to_1_token: float  # mean verify decode / target 1-token decode
    predicted_speedup: float | None


class SourceAcceptance(Part):
    """Acceptance of the drafts of one source ("model", "ngram") within a configuration."""

    source: str
    steps: int  # steps this source drafted
    took_over: int  # of those, steps in which it took another source's draft over
    drafted: int
    accepted: int
    judged: int
    acceptance_rate: float | None
    alpha: float | None


class Summary(Part):
    """Every figure for one configuration over some rounds (one task's, or all)."""

    runs: int
    baseline: SideSummary
    speculative: SideSummary
    speedup: Spread | None  # of per-round wall-clock tokens/s ratios
    drafted: int
    accepted: int
    judged: int  # draft tokens the target ruled on (PositionCounts.judged)
    target_decodes: int
    acceptance_rate: float | None
    per_position_acceptance: list[float | None]
    alpha: float | None
    tokens_per_target_decode: float | None  # counts the target's own correction/bonus token
    accepted_per_target_decode: float | None
    draft_lengths: dict[int, int]  # target decodes by tokens drafted (the K chosen), 0 included
    mean_draft_length: float | None  # drafted / target decodes
    by_source: list[SourceAcceptance]
    observed_costs: ObservedCosts | None
    predicted: Prediction | None
    prediction_not_applicable: str | None  # why there is no prediction, where the formula does not apply
    efficiency: float | None  # measured median speedup / predicted speedup


class TaskSummary(Summary):
    task: str


class ConfigResult(Part):
    """The figures of one speculative configuration (a draft source and K), overall and by task."""

    spec: str  # the draft source: "model", "ngram" or "ngram+model"
    k: ReportK
    label: str  # how the report names it: "model K=4", "ngram auto"
    overall: Summary
    tasks: list[TaskSummary]


class VerifyCost(Part):
    k: int
    tokens: int
    seconds: float
    relative_to_1_token: float


class Costs(Part):
    """Profiled decode times (medians), the inputs of the prediction."""

    position: int  # tokens in the cache when profiled
    reps: int
    target_decode_1_seconds: float
    draft_decode_1_seconds: float | None  # None: no draft model loaded
    c: float  # draft 1-token decode / target 1-token decode; 0 without a draft model (n-gram lookup)
    verify: list[VerifyCost]  # (K+1)-token target decodes with K+1 logit rows

    def verify_ratio(self, k: int) -> float:
        return next(v.relative_to_1_token for v in self.verify if v.k == k)


class Best(Part):
    """The configuration with the highest median measured speedup, and why."""

    label: str
    spec: str
    k: ReportK
    speedup: float
    reason: str


class Parting(Part):
    """Where a greedy speculative output parted from the target's own, and whether a near-tie explains it."""

    task: str
    prompt_index: int
    run: int
    spec: str
    k: ReportK
    verify_rows: int  # the batch width the tolerance was measured at: the widest verify the run used
    index: int
    target_token: int | None  # None where one side stopped and the other went on
    speculative_token: int | None
    top_two_gap: float | None
    tolerance: float | None
    near_tie: bool
    description: str


class GreedyCheck(Part):
    applies: bool
    status: Literal["passed", "near_tie", "failed", "not_applicable"]
    checked: int
    identical: int
    partings: list[Parting]

    @property
    def unexplained(self) -> list[Parting]:
        return [p for p in self.partings if not p.near_tie]


# --- what the run was ------------------------------------------------------------------------------------


class Settings(Part):
    spec: list[str]
    k: list[ReportK]
    n_predict: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    greedy: bool
    seed: int
    runs: int
    warmup: int
    n_ctx: int


class Environment(Part):
    speccli: str
    python: str
    platform: str
    llama_cpp_python: str
    backend: str
    gpu_offload_supported: bool
    system_info: str
    cpu_count: int
    threads: int
    target_n_gpu_layers: int
    draft_n_gpu_layers: int | None  # None: no draft model loaded
    target_runs_on: str = "CPU"  # the devices its layers are on: "CPU", "CUDA0", "RPC 10.0.0.2:50052"
    draft_runs_on: str | None = None  # None: no draft model loaded


class ModelFile(Part):
    name: str
    path: str
    size_bytes: int
    sha256: str


class Models(Part):
    pair: str | None
    target: ModelFile
    draft: ModelFile | None  # None: no configuration needed a draft model
    # How the draft model drafts: "ids" (the target's vocabulary); another vocabulary's "shared tokens"
    # (with q) or "text" (re-tokenized by the target; speccli/drafting/translated.py); None without one.
    draft_proposes: str | None = None


class PromptsInfo(Part):
    source: str
    sha256: str
    count: int
    tasks: list[str]


NOTES = {
    "wall_tokens_per_second": "decode phase only (prefill timed apart), wall-clock, each run from its own token count",
    "stats": "the engine's RunStats: its times are per-step timer sums, not wall-clock",
    "tokens_per_target_decode": "counts the target's own correction or bonus token",
    "predicted": "a prediction, not a measurement: (1 - alpha^(K+1)) / (1 - alpha) / (K*c + v(K+1)); "
    "only for a fixed K with a model draft",
    "draft_lengths": "target decodes by the number of tokens drafted before them (the K chosen), 0 included",
    "by_source": "acceptance of each draft source's tokens within a configuration",
    "efficiency": "measured median speedup / predicted speedup",
}


class BenchReport(Part):
    """`speccli bench --json`: every figure, the settings, the environment and the model hashes."""

    schema_version: Literal[7]
    kind: Literal["speccli-bench"]
    created: str  # ISO 8601, UTC
    command: str  # the command line that repeats the measurement
    settings: Settings
    environment: Environment
    models: Models
    prompts: PromptsInfo
    notes: dict[str, str]
    costs: Costs
    results: list[ConfigResult]  # one per (spec, K), specs in the order asked for, auto first
    best: Best | None  # None for a single configuration
    cannot_pay: str | None  # one line where speculation did not pay here, and whether the costs say it cannot
    greedy_check: GreedyCheck
    measurements: list[Measurement]  # every measured generation, warm-ups left out
    stopped: str | None  # where an interrupt (Ctrl-C, SIGTERM) ended the run early: after how many rounds


def report_schema() -> dict:
    """The JSON Schema (draft 2020-12) that every written report validates against."""
    schema = BenchReport.model_json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
