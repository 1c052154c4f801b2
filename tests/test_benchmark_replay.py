"""The replay benchmark (tests/benchmarks/replay.py) on the tiny related pair: its accounting, and that
the same recording and costs give the same figures."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from speccli.core.sampling import top_probability
from speccli.drafting.policy import VerifyCosts
from speccli.validation import parse_k
from tests.benchmarks import judges
from tests.benchmarks.replay import (
    MeasuredCurve,
    RecordedDraftModel,
    Reply,
    compact,
    parse_costs,
    record,
    replay,
    schedule,
)
from tests.conftest import loaded_related_pair

COSTS = VerifyCosts({1: 1.0, 2: 1.3, 4: 1.6, 8: 2.2, 16: 3.5})
C = 0.4


@pytest.fixture(scope="module")
def replies(tmp_path_factory):
    with loaded_related_pair(tmp_path_factory.mktemp("replay"), target_layers=4, draft_layers=2, eps=0.1) as (target, draft):
        prompts = [(task, target.tokenizer.tokenize(text)) for task, text in (("a", "a b c d a b"), ("b", "x y z"))]
        yield record(target, draft, prompts, n_predict=12)


def k2_steps(reply: Reply) -> list[tuple[int, int]]:
    """(drafted, kept) of each step of a K=2 replay of the draft model: each step drafts min(2, tokens
    left - 1) recorded tokens and keeps them up to the first that differs from the reply."""
    t, steps = 0, []
    while t < len(reply.tokens):
        k = min(2, len(reply.tokens) - t - 1)
        drafted = [token for token, _ in reply.drafts[t][:k]]
        kept = next((i for i, token in enumerate(drafted) if token != reply.tokens[t + i]), k)
        steps.append((k, kept))
        t += kept + 1
    return steps


def test_a_fixed_k_replay_prices_each_step_as_drafted_and_kept(replies) -> None:
    """Each K=2 step costs k draft decodes and a verify of k + 1 rows."""
    assert all(reply.tokens for reply in replies)
    for reply in replies:
        cost = sum(k * C + COSTS.decode(k + 1) for k, _ in k2_steps(reply))
        assert replay([reply], "model", 2, 1, C, COSTS)[reply.task] == [pytest.approx(len(reply.tokens) / cost)]
    outcomes = {kept == k for reply in replies for k, kept in k2_steps(reply)}
    assert outcomes == {True, False}  # drafts kept whole and drafts cut short both priced


def test_warm_up_replays_the_first_prompt_unmeasured_before_the_rounds_as_bench_does() -> None:
    a, b = (Reply(task, [1], [2], [[(2, 0.9)]]) for task in "ab")
    assert schedule([a, b], rounds=2, warmup=2) == [(a, False), (a, False), (a, True), (b, True), (a, True), (b, True)]


def test_costs_are_four_points_or_a_curve_timed_at_every_size() -> None:
    c, points = parse_costs("0.5:1.2,1.5,2,3")
    assert c == 0.5 and points.decode(4) == 1.5 and points.decode(3) == pytest.approx(1.35)
    curve = [1.0, 1.9, 1.7] + [2.0] * 22
    assert parse_costs("0.6:" + ",".join(map(str, curve)))[1] == MeasuredCurve(curve)
    for bad in ("0.5", "0.5:1,2,3", "0.5:2," + ",".join(["2"] * 24)):
        with pytest.raises(ValueError):
            parse_costs(bad)


def test_a_measured_curve_is_priced_as_given_and_warm_up_replays_are_not_counted(replies) -> None:
    """A curve timed at every size may dip (3 rows cheaper than 2 here): each K=2 verify of 3 rows costs
    exactly V(3). Warm-up replays of the first reply add no figures, and under a fixed K (which learns
    nothing) change none."""
    curve = MeasuredCurve([1.0, 1.3, 1.2] + [2.0] * 22)
    for reply in replies:
        cost = sum(k * C + curve.decode(k + 1) for k, _ in k2_steps(reply))
        assert replay([reply], "model", 2, 1, C, curve)[reply.task] == [pytest.approx(len(reply.tokens) / cost)]
    assert replay(replies, "model", 2, 1, C, curve, warmup=3) == replay(replies, "model", 2, 1, C, curve)


def test_the_same_recording_and_costs_give_the_same_figures(replies) -> None:
    for spec in ("ngram+model", "ngram", "model"):
        assert replay(replies, spec, "auto", 2, C, COSTS) == replay(replies, spec, "auto", 2, C, COSTS)


def test_a_draft_models_catch_up_and_prompt_intake_are_priced_where_it_pays_them() -> None:
    """The reply copies the prompt's 3..8 (the lookup drafts it, K=2), then goes on with tokens never
    seen, where the lookup has no match and the model drafts: it first takes in the prompt it never
    saw (at its first draft), then what it skipped of the reply."""
    prompt, tokens = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2], [3, 4, 5, 6, 7, 8, 90, 91, 92, 93, 94]
    reply = copying_reply(prompt, tokens)
    free, priced = (replay([reply], "ngram+model", 2, 1, C, COSTS, catch_up=costs)["copy"] for costs in ((0, 0), (0.5, 0.25)))
    # Lookup steps n2/2 n2/2, and n2/0 (8 went on with 1 2 in the prompt; the target yields 90). Then the
    # model, its 9 prompt tokens and 8 of the reply behind (7 caught up, the pending one decoded with its
    # first draft): m2/2, and a plain step for the last token.
    cost = 3 * COSTS.decode(3) + 2 * C + COSTS.decode(3) + COSTS.decode(1)
    intake = (0.5 + 0.25 * 9) * C
    assert free == [pytest.approx(len(tokens) / cost)]
    assert priced == [pytest.approx(len(tokens) / (cost + intake + (0.5 + 0.25 * 7) * C))]
    # Drafting every step, the model alone never falls behind: its prompt is all it takes in.
    alone_free = replay([reply], "model", 2, 1, C, COSTS)["copy"][0]
    alone_priced = replay([reply], "model", 2, 1, C, COSTS, catch_up=(0.5, 0.25))["copy"][0]
    assert len(tokens) / alone_priced == pytest.approx(len(tokens) / alone_free + intake)


def copying_reply(prompt: list[int], tokens: list[int], task: str = "copy") -> Reply:
    drafts = [[(token, 0.9) for token in tokens[t:]] or [(0, 0.9)] for t in range(len(tokens))]  # the model is always right
    return Reply(task, prompt, tokens, drafts)


def test_remembering_as_serve_keeps_the_prompt_a_request_shares_with_the_last_in_the_draft_cache() -> None:
    """The same request twice (a regeneration): as bench, each reply's draft model takes in the whole
    prompt; as serve (`remember`), the second finds it in its cache and takes in nothing."""
    reply = copying_reply([1, 2, 3, 4, 5, 6, 7, 8, 1, 2], [3, 4, 5, 6, 7, 8, 90, 91, 92, 93, 94])
    free = replay([reply], "model", 2, 1, C, COSTS)["copy"][0]
    fresh = replay([reply], "model", 2, 2, C, COSTS, catch_up=(0.5, 0.25))["copy"]
    remembered = replay([reply], "model", 2, 2, C, COSTS, catch_up=(0.5, 0.25), remember=True)["copy"]
    assert fresh[0] == fresh[1] == remembered[0] < free
    assert remembered[1] == pytest.approx(free)


def test_a_tasks_replies_in_a_round_are_summed_as_a_workloads_requests() -> None:
    """A workload's requests share a task: its figure for a round is their tokens over their cost."""
    short, long = copying_reply([1, 2], [3, 4], "w"), copying_reply([5, 6], list(range(10, 30)), "w")
    alone = {len(r.tokens): replay([r], "model", 2, 1, C, COSTS)["w"][0] for r in (short, long)}
    cost = sum(tokens / speedup for tokens, speedup in alone.items())
    assert replay([short, long], "model", 2, 1, C, COSTS)["w"] == [pytest.approx(sum(alone) / cost)]


def test_the_stand_in_draft_model_gives_each_recorded_token_at_its_confidence_then_misses() -> None:
    """ModelDrafter reads the draft's token as the row's argmax and its confidence as the row's top
    probability: the stand-in's rows give back what was recorded, confident or not, and past the
    recorded depth an id the recording never uses (a miss). Ids are renumbered densely first."""
    confidences = [1.0, 0.9, 0.5, 0.3, 0.05]
    reply = Reply("t", [700, 3], [900, 700], [[(900 + i, c) for i, c in enumerate(confidences)], [(5, 1.0)]])
    (compacted,), n_vocab = compact([reply])
    assert compacted.prompt == [0, 1] and compacted.tokens == [2, 0]
    assert n_vocab == 8 + 20 + 1  # 8 ids, 20 more to share 0.95 (the least confidence), the miss
    model = RecordedDraftModel(n_vocab)
    model.reply = compacted
    model.decode(compacted.prompt[:-1], n_logit_rows=0)
    model.step_from(len(compacted.prompt))
    rows = [model.decode([compacted.prompt[-1]])[0]]
    for _ in range(len(confidences)):
        rows.append(model.decode([int(rows[-1].argmax())])[0])
    scratch = np.empty(n_vocab, dtype=np.float32)
    read = [(int(row.argmax()), round(top_probability(row, out=scratch), 6)) for row in rows]
    assert read == [(2, 1.0), (3, 0.9), (4, 0.5), (5, 0.3), (6, 0.05), (n_vocab - 1, 0.5)]
    assert (model.decodes, model.caught_up) == (6, 0) and model.n_past == len(compacted.prompt) + 5


def test_a_suffix_source_recalls_earlier_replies_only_where_told_to_remember() -> None:
    """A reply no lookup in its own context can draft: a `suffix` source drafts it from the second round
    on where it keeps earlier replies (as serve), and like the context lookup alone where it starts each
    reply from nothing (as bench)."""
    tokens = list(range(10, 40))  # no token repeats: the context lookup has nothing to draft
    reply = Reply("t", [1, 2], tokens, [[(0, 0.5)] for _ in tokens])
    lookup = replay([reply], "ngram", "auto", 2, C, COSTS)["t"]
    assert lookup == pytest.approx([1.0, 1.0])  # every step a plain one
    assert replay([reply], "suffix", "auto", 2, C, COSTS)["t"] == lookup
    remembered = replay([reply], "suffix", "auto", 2, C, COSTS, remember=True)["t"]
    assert remembered[0] == pytest.approx(1.0) and remembered[1] > 2.0


def test_the_judges_replay_each_recording_at_its_costs_and_compare_with_a_saved_run(replies, tmp_path) -> None:
    """tests/benchmarks/judges.py: a recording's figures are replay.py's at its judges' costs, a second
    run against the first changes nothing, and a recording missing from the folder is said, not fatal."""
    (tmp_path / "gemma48.json").write_text(json.dumps([reply.__dict__ for reply in replies]))
    script = Path(__file__).parent / "benchmarks" / "judges.py"

    def run(*args: str) -> list[str]:
        done = subprocess.run([sys.executable, str(script), "--recordings", str(tmp_path), *args],
                              capture_output=True, text=True, check=True)
        return done.stdout.splitlines()

    first = run("--save", str(tmp_path / "first.json"))
    assert f"{tmp_path / 'qwen48.json'}: missing, left out (replay.py makes it: see this file's docstring)" in first
    saved = json.loads((tmp_path / "first.json").read_text())
    costs, n_predict, rounds, warmup, remember = judges.JUDGES["gemma48"]
    assert len(saved) == len(costs) * 3
    verify_costs, catch_up, host, draft_first = judges.COSTS["gemma cpu"]
    c, verify = parse_costs(verify_costs)
    direct = replay(replies, "model", parse_k("auto"), rounds, c, verify, (), catch_up, warmup, host, remember, draft_first, n_predict)
    assert saved["gemma48 gemma cpu model auto"]["tasks"] == {task: pytest.approx(np.mean(values)) for task, values in direct.items()}
    again = [line for line in run("--against", str(tmp_path / "first.json")) if line.startswith("gemma48")]
    assert len(again) == len(saved) and all("(+0.00%" in line for line in again)


def test_each_rule_removed_by_the_benchmark_is_found_once_in_todays_code() -> None:
    """rules_removed.py patches a copy of the package: each patch's text must still name one place, or its
    row of RESULTS.md's table would judge code that no longer exists."""
    from tests.benchmarks.rules_removed import REPO, RULES, patched

    for rule, patches in RULES.items():
        for file, old, new in patches:
            source = (REPO / "speccli" / file).read_text()
            assert source.count(old) == 1, rule
            assert patched(source, old, new, rule) != source
    with pytest.raises(SystemExit, match="no longer applies"):
        patched("x = 1\n", "y = 2", "y = 3", "a rule whose code went")
