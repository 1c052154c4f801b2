"""What one `speccli bench` run is asked to do: the configurations (draft sources x K values, parsed by
`speccli.settings`, the same rules as chat and models.toml), the measuring settings, and the command
line that repeats them."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from speccli.core.sampling import SamplingParams
from speccli.errors import SpeccliError
from speccli.models.pair import PairRequest
from speccli.settings import format_k, needs_draft_model, parse_k_sweep, parse_spec_list


@dataclass(frozen=True)
class Configuration:
    """One speculative side of a round: a draft source and K (None: auto, chosen per step)."""

    spec: str
    k: int | None

    @property
    def label(self) -> str:
        return f"{self.spec} {'auto' if self.k is None else f'K={self.k}'}"


@dataclass(frozen=True)
class BenchSettings:
    """How to measure. `specs` and `ks` are empty until known (from --spec/--k, or the pair's)."""

    specs: tuple[str, ...] = ()
    ks: tuple[int | None, ...] = ()
    n_predict: int = 64
    sampling: SamplingParams = SamplingParams(temperature=0.0)
    seed: int = 42
    runs: int = 2
    warmup: int = 1

    def validate(self) -> None:
        if self.runs < 1:
            raise SpeccliError(f"--runs must be >= 1, got {self.runs}")
        if self.warmup < 0:
            raise SpeccliError(f"--warmup must be >= 0, got {self.warmup}")
        if self.n_predict < 1:
            raise SpeccliError(f"--n-predict must be >= 1, got {self.n_predict}")
        self.sampling.validate()

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    @property
    def configurations(self) -> list[Configuration]:
        """Every (spec, K), specs in the order given, K as parsed (auto first)."""
        return [Configuration(spec, k) for spec in self.specs for k in self.ks]


@dataclass(frozen=True)
class BenchRequest:
    """Everything `speccli bench` was given: the pair to load, the spec and K lists, the settings, the files."""

    pair: PairRequest
    spec_list: str | None  # None: the pair's spec
    k_spec: str | None  # None: the pair's k
    settings: BenchSettings
    prompts_file: Path | None
    json_path: Path | None

    def resolve_specs(self) -> list[str] | None:
        """The draft sources asked for, or None to use the pair's (known once the pair is resolved)."""
        return parse_spec_list(self.spec_list) if self.spec_list is not None else None

    def resolve_ks(self) -> list[int | None] | None:
        """The K values asked for (None in the list: auto), or None to use the pair's k."""
        return parse_k_sweep(self.k_spec) if self.k_spec is not None else None

    def loading_request(self) -> PairRequest:
        """The pair request whose spec loads what every asked-for source needs: a draft model if any
        of them drafts with one; none (and a given --draft refused) if all are n-gram lookup."""
        specs = self.resolve_specs()
        if specs is None:
            return self.pair
        with_model = [spec for spec in specs if needs_draft_model(spec)]
        return replace(self.pair, spec=with_model[0] if with_model else specs[0])

    def reproducing_command(self, settings: BenchSettings, n_ctx: int) -> str:
        """The command line that repeats this measurement, every default spelled out (`n_ctx`: the
        context the models were loaded with)."""
        pair = self.pair
        sampling = settings.sampling
        words = ["speccli", "bench"] + ([pair.pair] if pair.pair else [])
        for option, value in (
            ("--target", pair.target),
            ("--draft", pair.draft),
            ("--spec", ",".join(settings.specs)),
            ("--k", ",".join(map(format_k, settings.ks))),
            ("--n-predict", settings.n_predict),
            ("--temp", f"{sampling.temperature:g}"),
            ("--top-k", sampling.top_k),
            ("--top-p", f"{sampling.top_p:g}"),
            ("--min-p", f"{sampling.min_p:g}"),
            ("--seed", settings.seed),
            ("--runs", settings.runs),
            ("--warmup", settings.warmup),
            ("--prompts", self.prompts_file),
            ("--ctx", n_ctx),
            ("--threads", pair.n_threads),
            ("--ngl", pair.target_n_gpu_layers),
            ("--ngl-draft", pair.draft_n_gpu_layers),
            *(("--config", path) for path in pair.config),
        ):
            if value is not None:
                words += [option, str(value)]
        return shlex.join(words)
