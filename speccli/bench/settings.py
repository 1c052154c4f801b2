"""What one `speccli bench` run is asked to do: the configurations (draft sources x K values, parsed by
`speccli.validation`, the same rules as chat and models.toml), the measuring settings, and the command
line that repeats them."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from speccli.core.constraint import GrammarSpec
from speccli.core.sampling import SamplingParams
from speccli.errors import SpeccliError
from speccli.models.pair import PairRequest
from speccli.drafting.registry import uses_draft_model
from speccli.validation import AUTO_K, K


@dataclass(frozen=True)
class Configuration:
    """One speculative side of a round: a draft source and K."""

    spec: str
    k: K

    @property
    def label(self) -> str:
        return f"{self.spec} {AUTO_K if self.k == AUTO_K else f'K={self.k}'}"


@dataclass(frozen=True)
class BenchSettings:
    """How to measure. `specs` and `ks` are empty until known (from --spec/--k, or the pair's)."""

    specs: tuple[str, ...] = ()
    ks: tuple[K, ...] = ()
    n_predict: int = 64
    sampling: SamplingParams = SamplingParams(temperature=0.0)
    seed: int = 42
    runs: int = 2
    warmup: int = 1
    grammar: GrammarSpec | None = None  # --json-schema or --grammar: every reply, both sides, follows it

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
    specs: list[str] | None  # --spec, parsed; None: not given (the pair's spec)
    ks: list[K] | None  # --k, parsed; None: not given (the pair's k)
    settings: BenchSettings
    prompts_file: Path | None
    json_path: Path | None
    grammar_option: tuple[str, str] | None = None  # ("--json-schema", what was given), for the command line

    def resolved(self, spec: str, k: K) -> BenchSettings:
        """The settings with every spec and K known: those asked for, else the pair's (`spec`, `k`)."""
        return replace(self.settings, specs=tuple(self.specs or [spec]), ks=tuple(self.ks or [k]))

    def loading_request(self) -> PairRequest:
        """The pair request whose spec loads what every asked-for source needs: a draft model if any
        of them drafts with one; none (and a given --draft refused) if all are n-gram lookup."""
        if self.specs is None:
            return self.pair
        with_model = [spec for spec in self.specs if uses_draft_model(spec)]
        return replace(self.pair, spec=with_model[0] if with_model else self.specs[0])

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
            ("--k", ",".join(map(str, settings.ks))),
            ("--n-predict", settings.n_predict),
            ("--temp", f"{sampling.temperature:g}"),
            ("--top-k", sampling.top_k),
            ("--top-p", f"{sampling.top_p:g}"),
            ("--min-p", f"{sampling.min_p:g}"),
            ("--seed", settings.seed),
            ("--runs", settings.runs),
            ("--warmup", settings.warmup),
            ("--prompts", self.prompts_file),
            self.grammar_option or ("--grammar", None),
            ("--ctx", n_ctx),
            ("--threads", pair.n_threads),
            ("--ngl", pair.target_n_gpu_layers),
            ("--ngl-draft", pair.draft_n_gpu_layers),
            ("--rpc", ",".join(map(str, pair.rpc)) if pair.rpc else None),
            ("--tensor-split", ",".join(f"{share:g}" for share in pair.tensor_split) or None),
            *(("--config", path) for path in pair.config),
        ):
            if value is not None:
                words += [option, str(value)]
        if pair.rpc_draft:
            words.append("--rpc-draft")
        return shlex.join(words)
