"""quant-check on real files: Gemma 3 270M F32 as the reference; its Q8_0, Q4_K_M and Q2_K quants and a
broken file as candidates (tests/quant_check_files.py builds and caches them). Short texts keep it quick."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from speccli.checks.corpus import BUILTIN_TEXTS
from speccli.checks.fidelity import TokenSequence, measure
from speccli.checks.report import predict_draft_speedup
from speccli.cli.app import app
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.core.stats import DoneEvent, StepEvent, TokenEvent
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import Planner
from speccli.drafting.policy import FixedK
from speccli.llama.model import LoadOptions, Model
from tests.quant_check_files import build_test_files, reference_file
from tests.tiny_gguf import poisoned_copy

T1 = SamplingParams(temperature=1.0)
OPTIONS = LoadOptions(n_ctx=512)
RANKED = ("Q8_0", "Q4_K_M", "Q2_K", "broken")


@pytest.fixture(scope="module")
def gemma() -> dict[str, Path]:
    reference = reference_file()
    return {"reference": reference, **build_test_files(reference)}


@pytest.fixture(scope="module")
def short_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in mix cut to about 70 tokens per kind (~200 positions)."""
    path = tmp_path_factory.mktemp("quant_check") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": name, "prompt": text[:300]}) + "\n" for name, text in BUILTIN_TEXTS.items()))
    return path


def _run(*args: str) -> object:
    return CliRunner().invoke(app, ["quant-check", *map(str, args)])


@pytest.fixture(scope="module")
def ranked_report(gemma: dict[str, Path], short_text: Path) -> dict:
    result = _run(gemma["reference"], *(gemma[name] for name in reversed(RANKED)), "--prompts", short_text, "--json")
    assert result.exit_code == 1, result.output  # the broken file is BROKEN
    report = json.loads(result.stdout)
    assert report["exit_code"] == 1 and report["context"] == 2048  # quant-check's default context
    return report


def test_ranking_is_q8_q4km_q2k_broken_on_every_figure(gemma: dict[str, Path], ranked_report: dict) -> None:
    candidates = ranked_report["candidates"]
    assert [Path(c["path"]).stem for c in candidates] == list(RANKED)
    assert [c["name"] for c in candidates] == [str(gemma[name]) for name in RANKED]  # as the command line gave them
    for better, worse in zip(candidates, candidates[1:]):
        assert better["acceptance"] > worse["acceptance"]
        assert better["greedy_acceptance"] > worse["greedy_acceptance"]
        assert better["kl_mean"] < worse["kl_mean"]
        assert better["kl_p99"] < worse["kl_p99"]
        assert better["tokens_per_verify"]["4"] > worse["tokens_per_verify"]["4"]


def test_q8_is_ok_and_the_broken_file_is_broken_with_evidence(ranked_report: dict) -> None:
    verdicts = {Path(c["path"]).stem: c for c in ranked_report["candidates"]}
    assert verdicts["Q8_0"]["verdict"] == "OK"
    assert verdicts["broken"]["verdict"] == "BROKEN"
    assert "OK:" in ranked_report["rule"] and "BROKEN:" in ranked_report["rule"]
    worst = verdicts["broken"]["worst"][0]
    assert worst["acceptance"] < 0.05 and worst["context"] and len(worst["reference_top"]) == 3
    # The reference's top token is likely where the broken candidate's is not.
    assert worst["reference_top"][0]["token"] != worst["candidate_top"][0]["token"]
    assert sum(s["count"] for s in verdicts["broken"]["by_position"]) == ranked_report["positions"]


def test_the_same_file_as_reference_and_candidate_scores_perfectly(gemma: dict[str, Path], tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(BUILTIN_TEXTS["prose"][:400])
    result = _run(gemma["Q2_K"], gemma["Q2_K"], "--text", text, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["exit_code"] == 0
    [same] = report["candidates"]
    assert same["verdict"] == "OK"
    assert same["acceptance"] == pytest.approx(1.0, abs=1e-5)
    assert same["greedy_acceptance"] == 1.0
    assert abs(same["kl_mean"]) < 1e-5 and abs(same["kl_p99"]) < 1e-5


def test_a_draft_not_clearly_faster_than_the_reference_predicts_no_speedup() -> None:
    reference = {n: 1.0 + 0.06 * (n - 1) for n in range(1, 10)}  # a flat verify curve, as Gemma's
    assert predict_draft_speedup(1.0, 0.95, reference) is None  # itself, timed a little faster by chance
    faster = predict_draft_speedup(0.9, 0.5, reference)
    assert faster is not None and faster.speedup > 1.2


def test_sequential_mode_matches_both_models_loaded(gemma: dict[str, Path]) -> None:
    sequences = [TokenSequence("code", _tokens(gemma["reference"], BUILTIN_TEXTS["code"][:250]))]
    together = measure(gemma["reference"], [gemma["Q2_K"]], sequences, T1, OPTIONS, sequential=False)
    apart = measure(gemma["reference"], [gemma["Q2_K"]], sequences, T1, OPTIONS, sequential=True)
    a, b = together.candidates[0], apart.candidates[0]
    np.testing.assert_allclose(b.acceptance, a.acceptance, atol=2e-3)
    np.testing.assert_allclose(b.kl, a.kl, atol=5e-3, rtol=1e-3)
    assert (a.same_top == b.same_top).mean() > 0.98


def _tokens(path: Path, text: str) -> list[int]:
    from speccli.llama.tokenizer import load_vocab_only

    with load_vocab_only(path) as tokenizer:
        return tokenizer.tokenize(text)


def test_expected_acceptance_equals_the_rate_speculative_sampling_measures(gemma: dict[str, Path]) -> None:
    """Generate at temperature 1 with K=1 (the engine bench drives), then teacher-force the same tokens:
    the accepted count must match Σ over the steps' positions of Σmin(p,q) within sampling error."""
    prompt_text = "Write a short story about a lighthouse keeper and a storm."
    with Model(gemma["reference"], OPTIONS) as target, Model(gemma["Q2_K"], OPTIONS) as draft:
        prompt = target.tokenizer.tokenize(prompt_text)
        generator = Generator(target, Planner(model=ModelDrafter(draft)), T1, FixedK(1), seed=7)
        produced: list[int] = []
        step_offsets: list[int] = []  # logits row (offset) each step's draft was judged at
        accepted_flags: list[int] = []
        for event in generator.generate(prompt, GenerationLimits(max_tokens=160)):
            if isinstance(event, StepEvent) and event.drafted:
                step_offsets.append(len(prompt) + len(produced) - 1)
                accepted_flags.append(event.accepted)
            elif isinstance(event, TokenEvent):
                produced.append(event.token)
            elif isinstance(event, DoneEvent):
                stats = event.stats
    sequence = prompt + produced
    measured = measure(gemma["reference"], [gemma["Q2_K"]], [TokenSequence("generated", sequence)], T1, OPTIONS, sequential=False)
    offsets = [o for o in step_offsets if o < len(sequence) - 1]
    alpha = measured.candidates[0].acceptance[offsets]
    accepted = np.array(accepted_flags[: len(offsets)])
    assert len(offsets) >= 60
    sigma = math.sqrt(float((alpha * (1 - alpha)).sum()))
    print(f"steps {len(offsets)}: accepted {accepted.sum()}, expected {alpha.sum():.1f} ± {sigma:.1f}; "
          f"engine rate {stats.acceptance_rate:.3f}, mean Σmin(p,q) {alpha.mean():.3f}")
    assert abs(accepted.sum() - alpha.sum()) < 4 * sigma, (accepted.sum(), alpha.sum(), sigma)
    # bench's figure (stats.acceptance_rate) against the mean expected acceptance over the same steps.
    assert abs(stats.acceptance_rate - alpha.mean()) < 4 * sigma / len(offsets) + 0.02


def test_a_candidate_with_another_vocabulary_is_one_line_exit_2(gemma: dict[str, Path], tiny_model: Path) -> None:
    result = _run(gemma["reference"], tiny_model)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith(
        f"error: candidate {tiny_model} does not share the vocabulary of reference {gemma['reference']} (check-vocab, "
    )
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_a_truncated_candidate_is_one_line_exit_2(gemma: dict[str, Path], tmp_path: Path, short_text: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    with gemma["Q2_K"].open("rb") as source, truncated.open("wb") as dest:
        dest.write(source.read(gemma["Q2_K"].stat().st_size // 2))
    result = _run(gemma["reference"], truncated, "--prompts", short_text)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith(f"error: {truncated}")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("mode", [[], ["--sequential"]], ids=["exact", "sequential"])
def test_logits_that_are_not_finite_are_broken_in_a_candidate_and_refused_in_a_reference(tiny_model: Path, tmp_path: Path,
                                                                                         mode: list[str]) -> None:
    nan = poisoned_copy(tiny_model, tmp_path / "nan.gguf")
    result = _run(tiny_model, nan, "--threads", "1", "--json", *mode)
    assert result.exit_code == 1, result.output  # 1: a candidate is BROKEN
    [candidate] = json.loads(result.stdout)["candidates"]
    assert candidate["verdict"] == "BROKEN" and candidate["acceptance"] == 0
    assert re.fullmatch(r"logits not finite \(NaN or infinity\) at (\d+) of \1 positions", candidate["reason"])
    assert candidate["kl_mean"] is None  # infinite: JSON has no Infinity

    result = _run(nan, tiny_model, "--threads", "1", *mode)
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"error: {nan}: its logits are not finite (NaN or infinity) at position 0 of sequence 1, so it "
                             "cannot serve as the reference: check the file against its source\n")


def test_a_long_candidate_path_folds_and_leaves_every_figure_whole(tiny_model: Path, tmp_path: Path) -> None:
    """The candidate column had kept its whole path on one line, and every figure came out as "…"."""
    deep = tmp_path / ("a-folder-with-a-long-name-" * 4) / "candidate.gguf"
    deep.parent.mkdir()
    shutil.copyfile(tiny_model, deep)
    result = CliRunner(env={"COLUMNS": "100"}).invoke(app, ["quant-check", str(tiny_model), str(deep), "-t", "1"])
    assert result.exit_code == 0, result.output
    [row] = [line for line in result.stdout.splitlines() if line.startswith("│ 1 │")]
    assert re.search(r"│ OK +│ 1\.000±0\.000 │ 1\.000 │ +0\.0000 │ +0\.000 │", row), result.stdout


@pytest.mark.parametrize(("command", "exit_code"), [(["quant-check", "half", "nosuchmodel"], 2),
                                                    (["chat", "-m", "half", "-md", "nosuchmodel", "-p", "hi"], 1)],
                         ids=["quant-check", "chat"])
def test_a_mistyped_name_is_refused_before_another_model_is_built(tiny_model: Path, tmp_path: Path, monkeypatch, command,
                                                                  exit_code) -> None:
    """The reference (a target) was built or downloaded first, then the typo in the next name reported."""
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "models.toml"
    config.write_text(f'[models.base]\npath = "{tiny_model}"\n[models.half]\nderive = {{ from = "base", ftype = "F16" }}\n')
    result = CliRunner().invoke(app, [*command, "--config", str(config)])
    assert result.exit_code == exit_code and result.stderr.startswith("error: unknown model 'nosuchmodel'"), result.output
    assert not (tmp_path / "cache" / "models" / "derived").exists()


def test_text_and_prompts_together_are_refused_before_loading_anything(gemma: dict[str, Path], short_text: Path) -> None:
    result = _run(gemma["reference"], gemma["Q8_0"], "--text", short_text, "--prompts", short_text)
    assert result.exit_code == 2  # 1 means a candidate is BROKEN
    assert result.stderr.strip() == "error: give --text or --prompts, not both"


@pytest.mark.parametrize(
    "args, message",
    [
        (["MODEL", "nosuchmodel"], "error: unknown model 'nosuchmodel'"),
        (["MODEL", "MODEL", "--temp", "inf"], "error: --temp must be a finite number, got inf"),
        (["MODEL", "MODEL", "--top-p", "0"], "error: --top-p must be in (0, 1]"),
        (["MODEL", "MODEL", "--threads", "0"], "error: --threads must be >= 1, got 0"),
        (["MODEL", "MODEL", "--ctx", "8"], "error: --ctx must be at least 16 tokens, got 8"),
    ],
)
def test_every_refusal_is_exit_2_since_1_means_broken(tiny_model: Path, args: list[str], message: str) -> None:
    result = _run(*(tiny_model if arg == "MODEL" else arg for arg in args))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message) and len(result.stderr.splitlines()) == 1

def test_a_candidate_given_twice_is_refused_before_anything_is_measured(tiny_model: Path, tmp_path: Path) -> None:
    """A file given twice (again, or by a link) had been measured twice, its noise printed as if two models
    differed; a copy of it is another file, and is measured (the control)."""
    link, copy = tmp_path / "link.gguf", tmp_path / "copy.gguf"
    link.symlink_to(copy)
    shutil.copyfile(tiny_model, copy)
    for twin in (copy, link):
        result = _run(tiny_model, copy, twin, "-t", "1")
        assert result.exit_code == 2, result.output
        assert result.stderr == f"error: candidate {twin} is the same file as candidate {copy}; give each once\n"
    assert _run(tiny_model, copy, "-t", "1").exit_code == 0
