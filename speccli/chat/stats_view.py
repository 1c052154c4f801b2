"""What chat shows of a `RunStats`, each a pure function of it: the statistics panel and its lines,
the one-line summary, the JSON record, and the speedup estimate against the target alone."""
from __future__ import annotations

import textwrap

from rich.panel import Panel
from rich.text import Text

from speccli.core.stats import PositionCounts, RunStats, drafting_record
from speccli.util.format import counted

# Per-position acceptance rows, the last pooling any positions past it: more would outgrow a terminal.
MAX_POSITION_BARS = 12


def estimated_speedup(stats: RunStats, target_token_seconds: float | None) -> float | None:
    """Achieved tokens/s over what the target alone would reach, at most the tokens per target decode.

    The target alone makes one token per 1-token decode, so its rate is 1 / target_token_seconds,
    from the pair's cost profile, timed as the session starts (`core.generator.measure_costs`). The ratio
    counts every cost speculation adds (drafting, the wider K+1-token verification decode, sampling),
    since those are all inside the achieved rate's decode time. Prefill is left out of both.
    A step costs at least one target decode, so no run can beat the target alone by more than the
    tokens its steps yield per target decode: a baseline timed slow cannot show more (a tiny model's
    ~1093x, or 49.83x at 1.00 tokens per decode).
    """
    if not target_token_seconds or not stats.decode_seconds or not stats.generated:
        return None
    return min(stats.tokens_per_second * target_token_seconds, stats.tokens_per_target_decode)


def acceptance_bar(fraction: float, width: int = 10) -> str:
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[rest] if rest else "")).ljust(width)


def draft_lengths_text(stats: RunStats) -> str:
    """The K chosen, step by step: "mean 5.2 · 0×12 4×3 31×6" (steps by tokens drafted)."""
    histogram = " ".join(f"{length}×{count}" for length, count in sorted(stats.draft_lengths.items()))
    return f"mean {stats.mean_draft_length:.1f} · {histogram}"


def by_source_text(stats: RunStats) -> str:
    """Acceptance of each draft source: "model 75% of 16 · ngram 91% of 120 (3 take-overs)", a take-over
    being a step in which the source continued another's draft."""
    return " · ".join(
        f"{source} {counts.acceptance_rate:.0%} of {counts.drafted}"
        + (f" ({counted(stats.take_overs[source], 'take-over')})" if stats.take_overs.get(source) else "")
        for source, counts in sorted(stats.by_source.items())
    )


LABEL_WIDTH = 14


def stats_text(stats: RunStats, target_token_seconds: float | None, max_lines: int | None = None,
               width: int | None = None) -> Text:
    """Label/value lines, each value wrapped at `width` columns under itself where given, the per-position
    rows cut to fit `max_lines` where given. Plain Text, not a rich Table: it renders several times
    faster, and the live view redraws it a few times a second while the models run."""
    rows: list[tuple[str, str | Text]] = [
        ("tokens", f"{stats.generated} in {stats.decode_seconds:.2f} s · {stats.tokens_per_second:.1f} tok/s")
    ]
    if stats.speculative:
        rows += [
            ("acceptance", f"{stats.acceptance_rate:.0%} of {stats.drafted_counted} drafted"),
            ("by source", by_source_text(stats)),
            ("k chosen", draft_lengths_text(stats)),
            ("per decode", f"{stats.tokens_per_target_decode:.2f} tokens per target decode"),
            (
                "time",
                f"draft {stats.draft_seconds:.2f} s{_catch_up_text(stats)} · target {stats.target_seconds:.2f} s"
                f" · other {stats.other_seconds:.2f} s{_host_text(stats)}",
            ),
        ]
    speedup = estimated_speedup(stats, target_token_seconds)
    rows.append(("est. speedup", f"{speedup:.2f}x vs target alone" if speedup else "-"))
    if width is not None:  # a value too long for a line goes on under itself, not under the labels
        rows = [(label if not index else "", piece) for label, value in rows
                for index, piece in enumerate(_wrapped(value, max(20, width - LABEL_WIDTH)))]
    positions = position_rows(stats.positions)
    if max_lines is not None:
        positions = positions[: max(0, max_lines - len(rows))]
    for label, fraction in positions:
        rows.append((f"  draft {label}", Text(f"{acceptance_bar(fraction)} {fraction:4.0%}", style="green")))
    text = Text()
    for index, (label, value) in enumerate(rows):
        if index:
            text.append("\n")
        text.append(f"{label:<{LABEL_WIDTH}}", style="dim")
        text.append(value)
    return text


def _wrapped(value: str, width: int) -> list[str]:
    """`value`'s lines at `width` columns, broken between its " · " parts where they fit whole."""
    lines = [""]
    for part in value.split(" · "):
        if lines[-1] and len(lines[-1]) + 3 + len(part) > width:
            lines[-1] += " ·"
            lines.append(part)
        else:
            lines[-1] = f"{lines[-1]} · {part}" if lines[-1] else part
    return [piece for line in lines for piece in textwrap.wrap(line, width) or [line]]


def position_rows(positions: PositionCounts) -> list[tuple[str, float]]:
    """(label, share kept) per draft position, the positions past MAX_POSITION_BARS - 1 pooled into the
    last row ("12-24"), so a 24-token draft still shows how its far end fared in 12 rows."""
    deepest = len(positions.drafted_at)
    shown = MAX_POSITION_BARS - 1 if deepest > MAX_POSITION_BARS else deepest
    rows = [(str(position), share) for position, share in enumerate(positions.acceptance_by_position()[:shown], start=1)]
    if shown < deepest:
        pooled = PositionCounts(sum(positions.drafted_at[shown:]), sum(positions.accepted_at[shown:]))
        rows.append((f"{shown + 1}-{deepest}", pooled.acceptance_rate))
    return rows


def _catch_up_text(stats: RunStats) -> str:
    """The part of drafting a draft model spent taking in tokens it skipped while the lookup drafted."""
    return f" (catch-up {stats.catch_up_seconds:.2f} s)" if stats.catch_up_seconds else ""


def stats_panel(stats: RunStats, target_token_seconds: float | None, title: str, max_height: int | None = None,
                width: int | None = None) -> Panel:
    """The statistics in a box at most `width` columns wide where given; its per-position rows dropped,
    where `max_height` is given, as far as needed to keep it that many lines tall (the other rows
    always show)."""
    lines = None if max_height is None else max_height - 2  # the box's top and bottom
    inside = None if width is None else width - 4  # its borders and padding
    return Panel(stats_text(stats, target_token_seconds, lines, inside), title=title, title_align="left", expand=False)


def summary_line(stats: RunStats, target_token_seconds: float | None) -> str:
    parts = [counted(stats.generated, "token"), f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.speculative:
        parts += [f"acceptance {stats.acceptance_rate:.0%}", f"{stats.tokens_per_target_decode:.2f} tok/decode"]
        parts.append(f"draft {stats.draft_seconds:.2f} s / target {stats.target_seconds:.2f} s")
    speedup = estimated_speedup(stats, target_token_seconds)
    if speedup:
        parts.append(f"~{speedup:.2f}x vs target alone")
    return " · ".join(parts)


def _host_text(stats: RunStats) -> str:
    """The host's own time per target row, where llama.cpp's decode time was counted (real models)."""
    if not stats.compute_seconds or not stats.target_rows:
        return ""
    return f" · host {stats.host_seconds / stats.target_rows * 1e6:.0f} µs/row"


def stats_record(stats: RunStats, target_token_seconds: float | None) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "generated_tokens": stats.generated,
        "mean_draft_length": round(stats.mean_draft_length, 4),
        **drafting_record(stats),
        "other_seconds": round(stats.other_seconds, 6),
        "tokens_per_second": round(stats.tokens_per_second, 3),
        "estimated_speedup": _rounded(estimated_speedup(stats, target_token_seconds)),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
