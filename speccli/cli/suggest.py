"""`speccli suggest`: rank draft options for a target on this machine by predicted speedup."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from speccli.cli.options import ConfigOption, ThreadsOption, given_path
from speccli.errors import SpeccliError, UsageError


def suggest(
    target: Annotated[str, typer.Argument(metavar="TARGET", help="Target model: registry name or GGUF path.")],
    candidates: Annotated[Optional[list[str]], typer.Argument(
        metavar="CANDIDATE", help="Drafts to weigh: registry names, GGUF paths, or 'ngram' (default: every registry model on disk, every "
        "GGUF in the Hugging Face cache, and ngram).")] = None,
    text: Annotated[Optional[Path], typer.Option("--text", metavar="FILE", parser=given_path("a text file"), help="Measure acceptance on this text (such as your own prompts) instead of the built-in mix.")] = None,
    confirm: Annotated[bool, typer.Option("--confirm", help="Then run a short real bench of the best two and show it beside the prediction.")] = False,
    write: Annotated[Optional[Path], typer.Option("--write", metavar="FILE", parser=given_path("a models.toml"), help="Add the winning pair to this models.toml (other entries untouched).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the ranking as JSON.")] = False,
    threads: ThreadsOption = None,
    config: ConfigOption = None,
) -> None:
    """Rank draft options for TARGET on this machine: acceptance, costs, best K and predicted speedup each."""
    from rich.console import Console

    from speccli.checks.corpus import builtin_source, text_file_source, tokenize_source
    from speccli.models.config import load_registry
    from speccli.models.resolve import RegistryFiles, resolve_model
    from speccli.suggest import NGRAM, Candidate, suggest as run_suggest, too_few_positions
    from speccli.util.progress import progress_bar

    registry = load_registry(*config or ())
    if write is not None:
        _checked_write_target(write, target)
    target_path = resolve_model(target, registry, fetch=False)
    source = text_file_source(text) if text else builtin_source()
    if candidates:
        chosen = []
        for name in candidates:
            if name == NGRAM:
                chosen.append(Candidate(NGRAM, None))
                continue
            try:
                path = resolve_model(name, registry, fetch=False)
            except SpeccliError as error:  # named in the ranking; the others are measured
                chosen.append(Candidate(name, None, skipped=str(error).removeprefix(f"{name}: ")))
                continue
            same = next((c.name for c in chosen if c.path is not None and c.path.resolve() == path.resolve()), None)
            chosen.append(Candidate(name, path) if same is None else Candidate(name, None, skipped=f"the same file as {same}"))
    else:
        files = RegistryFiles(registry)
        chosen = [Candidate(name, cached[0]) for name in registry.models
                  if name != target and (cached := files.cached(name)) and cached[0] != target_path]
        known = {candidate.path.resolve() for candidate in chosen} | {target_path.resolve()}
        chosen += [Candidate(name, path) for name, path in hub_cache_ggufs() if path.resolve() not in known]
        chosen.append(Candidate(NGRAM, None))
    err = Console(stderr=True)
    started: list[str] = []

    def progress(what: str, done: int, total: int) -> None:
        bar.update(task, description=what, completed=done, total=total)
        if not err.is_terminal and what not in started:  # no bar in a log: a line as each candidate starts
            started.append(what)
            err.print(f"measuring {what} ({len(started)} of {sum(c.skipped is None for c in chosen)})", soft_wrap=True, markup=False)

    with progress_bar(err) as bar:
        task = bar.add_task("loading the target", total=None)
        result = run_suggest(
            target, target_path, chosen,
            lambda model: [tokens for _, tokens in tokenize_source(source, model.tokenizer, min(512, model.n_ctx - 16))],
            source.description, threads, progress,
        )
    if confirm:
        for candidate in [c for c in result.ranked if c.predicted is not None][:2]:
            candidate.measured = _bench_speedup(target, candidate, threads, config)
    if json_output:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        out = Console()
        _render(result, Console(width=max(out.width, 120)) if not out.is_terminal else out)
        if (warning := too_few_positions(result)) is not None:
            err.print(f"note: {warning}", soft_wrap=True, markup=False)
    if write is not None:
        _write_pair(write, target, result, registry.models)
    if not any(c.predicted is not None for c in result.candidates):
        raise typer.Exit(1)  # the verdict said so: nothing was measured, a run that failed


def hub_cache_ggufs() -> list[tuple[str, Path]]:
    """("org/repo/file", path) for each GGUF file in the Hugging Face cache's snapshots (of a split
    model, its first part), newest snapshot first where one file is in several."""
    import re

    from speccli.models.hub import hub_cache_dir

    found: dict[str, Path] = {}
    snapshots = sorted(hub_cache_dir().glob("models--*/snapshots/*"), key=lambda path: path.stat().st_mtime, reverse=True)
    for snapshot in snapshots:
        repo = snapshot.parent.parent.name.removeprefix("models--").replace("--", "/")
        for path in sorted(snapshot.rglob("*.gguf")):
            split = re.search(r"-(\d{5})-of-\d{5}\.gguf$", path.name)
            if path.is_file() and (split is None or split.group(1) == "00001"):
                found.setdefault(f"{repo}/{path.relative_to(snapshot)}", path)
    return sorted(found.items())


def _render(result, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]speccli suggest[/bold] · target {escape(result.target)} · acceptance on {escape(result.text)}, greedy",
                  soft_wrap=True)
    console.print("  verify / 1-token decode here: " + ", ".join(f"V({n}) {v:.2f}" for n, v in result.verify.items() if n <= 5))
    table = Table()
    for column in ("candidate", "kind", "alpha", "proposes", "c", "best K", "predicted", "measured"):
        table.add_column(column, justify="left" if column in ("candidate", "kind") else "right")
    for c in result.ranked:
        if c.skipped is not None:
            table.add_row(escape(c.name), "skipped", "", "", "", "", "", "", end_section=False)
            continue
        alpha = f"{c.alpha:.2f}" if c.alpha is not None else "-"  # a lookup that proposed nothing
        table.add_row(escape(c.name), c.kind, alpha, f"{c.proposing:.0%}", f"{c.c:.2f}", str(c.best_k or "-"),
                      f"{c.predicted:.2f}x", f"{c.measured:.2f}x" if c.measured is not None else "")
    console.print(table)
    for c in result.ranked:
        if c.skipped is not None:
            console.print(f"  {escape(c.name)}: skipped: {escape(c.skipped)}", soft_wrap=True)
    console.print(escape(result.verdict()), soft_wrap=True)


def _bench_speedup(target: str, candidate, threads: int | None, config) -> float | None:
    """bench's measured speedup of the candidate at its best K (32 tokens, one run after a warm-up)."""
    import tempfile

    spec = ["--spec", "ngram"] if candidate.path is None else ["--spec", "model", "--draft", str(candidate.path)]
    k = str(candidate.best_k or "auto")  # nothing pays: what auto does about it
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "bench.json"
        command = [sys.executable, "-m", "speccli", "bench", "--target", target, *spec, "--k", k, "-n", "32", "--runs", "1",
                   "--warmup", "1", "--json", str(report), *(["--threads", str(threads)] if threads else []),
                   *[part for path in config or () for part in ("--config", str(path))]]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode not in (0, 3) or not report.exists():
            raise SpeccliError(f"--confirm: bench of {candidate.name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        speedup = json.loads(report.read_text())["results"][0]["overall"]["speedup"]
        return speedup["median"] if speedup else None


def _pair_name(target: str) -> str:
    return f"{Path(target).stem if target.endswith('.gguf') else target}-suggested"


def _checked_write_target(path: Path, target: str) -> tuple[str, dict]:
    """--write's file, checked before anything loads or is measured (it had been checked after a whole
    measurement): its text ("" for a file still to make) and what it holds. Each fault is a usage error."""
    import tomllib

    if path.is_dir():
        raise UsageError(f"--write {path}: a directory; name a models.toml file")
    if not path.parent.is_dir():
        raise UsageError(f"--write {path}: no folder {path.parent}")
    try:
        existing = path.read_text() if path.exists() else ""
        document = tomllib.loads(existing)
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--write {path}: unreadable ({getattr(error, 'strerror', None) or error})") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"--write {path}: not TOML ({error}); nothing written") from None
    if _pair_name(target) in document.get("pairs", {}):
        raise UsageError(f"--write {path}: it has a pair {_pair_name(target)} already; remove it first to write a new one")
    return existing, document


def _write_pair(path: Path, target: str, result, registry_names=()) -> None:
    """Append [pairs."TARGET-suggested"] naming the winner; refuse where that pair exists already. A pair
    names registry entries only, so a model given as a file gets a [models] entry of its own (`path`)."""
    existing, document = _checked_write_target(path, target)
    best = next((c for c in result.ranked if c.predicted is not None), None)
    if best is None or not best.best_k:
        raise SpeccliError(f"--write {path}: no candidate pays here, so no pair was written (the target alone is as fast)")
    taken = set(registry_names) | set(document.get("models", {}))
    lines: list[str] = []

    def entry(name: str, file: Path) -> str:
        if name in registry_names:
            return name
        model, n = file.stem, 1
        while model in taken:  # a name already in use gets a number
            n += 1
            model = f"{file.stem}-{n}"
        taken.add(model)
        lines.extend([f"\n[models.{json.dumps(model)}]", f"path = {json.dumps(str(file.resolve()))}"])
        return model

    pair = [f"target = {json.dumps(entry(target, Path(target)))}"]
    if best.path is not None:
        pair += [f"draft = {json.dumps(entry(best.name, best.path))}", 'spec = "model"']
    else:
        pair.append('spec = "ngram"')
    lines += [f'\n[pairs."{_pair_name(target)}"]', *pair, f"k = {best.best_k}"]
    with path.open("a") as file:
        file.write(("\n" if existing and not existing.endswith("\n") else "") + "\n".join(lines) + "\n")
    typer.echo(f"wrote pair {_pair_name(target)} to {path}", err=True)
