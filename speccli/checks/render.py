"""quant-check's report for a terminal: a ranking table, the evidence per candidate, the verdict rule."""
from __future__ import annotations


from rich.console import Group
from rich.table import Table
from rich.text import Text

from speccli.checks.report import CandidateReport, QuantCheckReport, TokenProbability
from speccli.checks.verdict import Fidelity
from speccli.util.format import counted

VERDICT_STYLE = {Fidelity.OK: "green", Fidelity.DEGRADED: "yellow", Fidelity.BROKEN: "bold red"}
WORST_SHOWN = 3


def render(report: QuantCheckReport) -> Group:
    s = report.sampling
    settings = f"temperature {s['temperature']:g}, top-k {s['top_k']}, top-p {s['top_p']:g}, min-p {s['min_p']:g}"
    header = Text.assemble(
        ("reference  ", "bold"), report.reference, "\n",
        ("text       ", "bold"), f"{report.text}: {counted(report.sequences, 'sequence')}, {counted(report.positions, 'position')}, context {report.context}\n",
        ("sampling   ", "bold"), f"{settings} (acceptance); KL and top-1 on the raw distributions\n",
        ("mode       ", "bold"), ("sequential: " if report.sequential else "") + report.reference_storage,
        f"; {report.seconds:.1f} s",
    )
    parts = [header, _ranking(report)]
    for candidate in report.candidates:
        parts.append(_evidence(candidate))
    parts.append(Text.assemble(("rule  ", "bold"), report.rule))
    return Group(*parts)


def _ranking(report: QuantCheckReport) -> Table:
    table = Table(title="candidates, most faithful first", title_justify="left")
    for name, justify in [
        ("#", "right"), ("candidate", "left"), ("verdict", "left"), ("accept Σmin", "right"), ("top-1", "right"),
        ("KL mean", "right"), ("KL p99", "right"), ("tok/verify K=1/4/8", "right"), ("as a draft", "right"),
    ]:
        # The figures keep their width; a long candidate path folds onto more lines instead of
        # squeezing every figure to "…".
        if name == "candidate":
            table.add_column(name, justify=justify, overflow="fold")
        else:
            table.add_column(name, justify=justify, no_wrap=True)
    for rank, c in enumerate(report.candidates, start=1):
        speedup = f"{c.draft_speedup.speedup:.2f}x K={c.draft_speedup.k}" if c.draft_speedup else "not faster"
        table.add_row(
            str(rank), Text(c.name), Text(c.verdict.value, style=VERDICT_STYLE[c.verdict]),
            f"{c.acceptance:.3f}±{c.acceptance_stderr:.3f}", f"{c.greedy_acceptance:.3f}",
            f"{c.kl_mean:.4f}", f"{c.kl_p99:.3f}", "/".join(f"{c.tokens_per_verify[k]:.2f}" for k in (1, 4, 8)), speedup,
        )
    table.caption = Text(f"1-token decode: reference {report.reference_seconds_per_token * 1000:.1f} ms, " + ", ".join(
        f"{c.name} {c.seconds_per_token * 1000:.1f} ms" for c in report.candidates
    ))
    return table


def _tops(tops: list[TokenProbability]) -> str:
    return "  ".join(f"{t.text!r} {t.probability:.2f}" for t in tops)


def _evidence(c: CandidateReport) -> Text:
    text = Text.assemble(
        ("\n" + c.name, "bold"), "  ", (c.verdict.value, VERDICT_STYLE[c.verdict]), f": {c.reason}\n",
        "  acceptance by position: ",
        "  ".join(f"{s.positions}: {s.acceptance:.2f} ({s.count})" for s in c.by_position), "\n",
    )
    for w in c.worst[:WORST_SHOWN]:
        following = "(end)" if w.actual_next is None else repr(w.actual_next)
        text.append(f"  worst: {w.sequence} @{w.offset}  acceptance {w.acceptance:.3f}  KL {w.kl:.3f}\n")
        text.append(f"    …{w.context[-60:]!r} → text has {following}\n")
        text.append(f"    reference: {_tops(w.reference_top)}\n    candidate: {_tops(w.candidate_top)}\n")
    return text
