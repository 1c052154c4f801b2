"""What one `speccli bench` run is asked to do: the K values (parsed in this one place), the measuring
settings, and the command line that repeats them."""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from speccli.drafting.policy import MAX_K
from speccli.errors import SpeccliError
from speccli.models.pair import PairRequest

_K_FORMS = "give a number (4), a list (1,2,4,8) or a range (1-8)"


def parse_k_spec(text: str, max_k: int = MAX_K) -> list[int]:
    """'4' -> [4]; '1,2,4,8' -> [1, 2, 4, 8]; '1-8' -> [1..8]; items may mix: '1-3,8'. Sorted, unique."""
    spec = text.strip()
    if not spec:
        raise SpeccliError(f"--k is empty; {_K_FORMS}")
    values: set[int] = set()
    for item in spec.split(","):
        item = item.strip()
        if re.fullmatch(r"-\d+", item):  # a negative number, not a range with its start left out
            raise SpeccliError(f"--k {text!r}: K (draft tokens per step) must be between 1 and {max_k}, got {item}")
        low_text, dash, high_text = item.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if dash else low
        except ValueError:
            raise SpeccliError(f"--k {text!r}: {item!r} is not a number or a range; {_K_FORMS}") from None
        if dash and low > high:
            raise SpeccliError(f"--k {text!r}: the range {item} runs backwards; write {high}-{low}")
        for value in (low, high):
            if not 1 <= value <= max_k:
                raise SpeccliError(f"--k {text!r}: K (draft tokens per step) must be between 1 and {max_k}, got {value}")
        values.update(range(low, high + 1))
    return sorted(values)


@dataclass(frozen=True)
class BenchSettings:
    """How to measure. `ks` is empty until the K values are known (from --k, or the pair's k)."""

    ks: tuple[int, ...] = ()
    n_predict: int = 64
    temperature: float = 0.0
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
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SpeccliError(f"--temp must be a finite number >= 0 (0 is greedy), got {self.temperature}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class BenchRequest:
    """Everything `speccli bench` was given: the pair to load, the K spec, the settings, the files."""

    pair: PairRequest
    k_spec: str | None  # None: the pair's k
    settings: BenchSettings
    prompts_file: Path | None
    json_path: Path | None

    def resolve_ks(self) -> list[int] | None:
        """The K values asked for, or None to use the pair's k (known once the pair is resolved)."""
        return parse_k_spec(self.k_spec) if self.k_spec is not None else None

    def reproducing_command(self, settings: BenchSettings) -> str:
        """The command line that repeats this measurement, every default spelled out."""
        pair = self.pair
        words = ["speccli", "bench"] + ([pair.pair] if pair.pair else [])
        for option, value in (
            ("--target", pair.target),
            ("--draft", pair.draft),
            ("--k", ",".join(map(str, settings.ks))),
            ("--n-predict", settings.n_predict),
            ("--temp", f"{settings.temperature:g}"),
            ("--seed", settings.seed),
            ("--runs", settings.runs),
            ("--warmup", settings.warmup),
            ("--prompts", self.prompts_file),
            ("--ctx", pair.n_ctx),
            ("--threads", pair.n_threads),
            ("--ngl", pair.target_n_gpu_layers),
            ("--ngl-draft", pair.draft_n_gpu_layers),
            ("--config", pair.config),
        ):
            if value is not None:
                words += [option, str(value)]
        return shlex.join(words)
