"""What `--k auto` learnt, kept between processes (speccli/remembered/learnt.py): a policy that recalls it
drafts as the one that learnt it would have gone on drafting, and a process (a chat, a restarted
server) that takes up the pair's cost profile times none; a file that cannot serve is one line and a
fresh start; `speccli remembered` lists and clears it."""
from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from speccli.cli.app import app
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams
from speccli.core.seam import CostProfile, DraftCosts
from speccli.core.stats import StepEvent
from speccli.drafting.model import ModelDrafter
from speccli.drafting.planner import Planner
from speccli.drafting.policy import AutoK
from speccli.remembered.learnt import COLD_START, FORMAT, LearntFile, learnt_path, policy_state, recall_state
from tests.conftest import MemoryBoundAutoK
from tests.standin import stand_in_pair
from tests.test_drafting import MEMORY_BOUND, calibrated, learn

GREEDY = SamplingParams(temperature=0)
PROFILE = CostProfile({n: 0.025 * units for n, units in MEMORY_BOUND.items()}, {"model": DraftCosts(0.025 * 0.3, {})})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(COLD_START, raising=False)
    return tmp_path


def files(tmp_path, name: str = "target.gguf"):
    """Stand-ins for a loaded pair: what the file is keyed by (the files' names and sizes, where they run)."""
    (tmp_path / name).write_bytes(b"t" * 10)
    (tmp_path / "draft.gguf").write_bytes(b"d" * 5)
    return (SimpleNamespace(path=tmp_path / name, name=name, placement="CPU", n_seq=1, options=SimpleNamespace(n_threads=None)),
            SimpleNamespace(path=tmp_path / "draft.gguf", name="a-draft", placement="CPU"))  # a registry name


def lengths_planned(policy: AutoK) -> list[int]:
    return [policy.plan(key, available).k for key in ("model", "ngram:3-5/once", "ngram:12+/same") for available in (1, 4, 16)]


def test_a_recalled_policy_plans_as_the_one_that_learnt() -> None:
    learnt = calibrated(MEMORY_BOUND, {"model": 0.3})
    learn(learnt, "model", 8, 2, 6, token_cost=0.3)
    learn(learnt, "ngram:3-5/once", 4, 4, 5)
    learn(learnt, "ngram:12+/same", 8, 1, 5)
    fresh, recalled = calibrated(MEMORY_BOUND, {"model": 0.3}), AutoK()
    recall_state(recalled, json.loads(json.dumps(policy_state(learnt))))  # through the file's JSON
    recalled.calibrate(PROFILE)
    assert lengths_planned(recalled) == lengths_planned(learnt)
    assert lengths_planned(fresh) != lengths_planned(learnt)  # what was learnt changes the plans: the test can fail


def reply_steps(generator: Generator, prompt: list[int]) -> list[tuple[int, int]]:
    return [(e.drafted, e.accepted) for e in generator.generate(prompt, GenerationLimits(max_tokens=40)) if isinstance(e, StepEvent)]


def test_a_process_that_recalls_drafts_its_first_reply_as_the_last_process_would_have_gone_on(cache, tmp_path) -> None:
    """One process answers two prompts; another answers the first and keeps what `auto` learnt, a third
    recalls it and answers the second: its steps are the first process's second reply's, step by step.
    A cold third process drafts otherwise (the control). The draft model alone, at pretended costs:
    nothing a step's timing says moves what it drafts (a lookup's chain weighs sources by their timed
    steps), so two runs of the same steps choose alike."""
    target_file, draft_file = files(tmp_path)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]

    def process() -> Generator:
        target, draft = stand_in_pair(eog_bias=0.0)
        return Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, MemoryBoundAutoK())

    continuing = process()
    reply_steps(continuing, prompts[0])
    second_reply = reply_steps(continuing, prompts[1])
    first = process()
    reply_steps(first, prompts[0])
    warned = []
    LearntFile(target_file, draft_file, warned.append).keep(first.policy, GREEDY, now=True)
    assert learnt_path(target_file, draft_file, GREEDY).is_file()
    warm = process()
    LearntFile(target_file, draft_file, warned.append).recall(warm.policy, GREEDY)
    assert reply_steps(warm, prompts[1]) == second_reply and warned == []
    assert reply_steps(process(), prompts[1]) != second_reply


def test_the_cost_profile_is_kept_and_a_process_that_recalls_it_times_none(cache, tmp_path, monkeypatch) -> None:
    """The profile the first process timed is the second's, and its first reply times nothing; a file
    whose profile lacks the draft model's costs is timed again (the control: timing is seen)."""
    from speccli.core import generator as generator_module

    timed, measure = [], generator_module.measure_costs
    monkeypatch.setattr(generator_module, "measure_costs", lambda *args: timed.append(args) or measure(*args))
    target_file, draft_file = files(tmp_path)

    def process() -> Generator:
        target, draft = stand_in_pair(eog_bias=0.0)
        return Generator(target, Planner(model=ModelDrafter(draft)), GREEDY, MemoryBoundAutoK())

    first = process()
    reply_steps(first, [1, 2, 3, 4])
    assert len(timed) == 1 and first.costs.asked == sorted(AutoK.profiled_sizes)
    LearntFile(target_file, draft_file, print).keep(first.policy, GREEDY, now=True, costs=first.costs)
    second = process()
    LearntFile(target_file, draft_file, print).recall(second.policy, GREEDY, second.costs)
    reply_steps(second, [1, 2, 3, 4])
    assert len(timed) == 1 and second.costs.measured == first.costs.measured

    path = learnt_path(target_file, draft_file, GREEDY)
    saved = json.loads(path.read_text())
    saved["costs"]["draft_costs"] = {}
    path.write_text(json.dumps(saved))
    third = process()
    LearntFile(target_file, draft_file, print).recall(third.policy, GREEDY, third.costs)
    reply_steps(third, [1, 2, 3, 4])
    assert len(timed) == 2 and third.costs.measured.draft_costs


def test_a_remembered_profile_stands_for_one_timed_for_fewer_sizes(monkeypatch) -> None:
    """chat at a fixed K times one-row costs only; `/k auto` then takes up the file's profile rather
    than timing the sizes `auto` asks for. One timed for more sizes than the file's is kept."""
    from speccli.core import generator as generator_module
    from speccli.core.generator import PairCosts

    timed = []
    monkeypatch.setattr(generator_module, "measure_costs", lambda *args: timed.append(args[3]) or PROFILE)
    fixed_k = PairCosts(None, None)
    fixed_k.profile([1], (), GREEDY)
    fixed_k.remember(PROFILE, [1, 2, 4])
    assert fixed_k.profile([1], (1, 2, 4), GREEDY) is PROFILE and timed == [[]]
    wider = PairCosts(None, None)
    wider.profile([1], (1, 2, 4, 8), GREEDY)
    wider.remember(CostProfile({1: 9.0}, {}), [1, 2])
    assert wider.measured is PROFILE and wider.asked == [1, 2, 4, 8]


def test_the_file_is_keyed_by_pair_regime_and_threads_and_cold_start_neither_reads_nor_writes(cache, tmp_path, monkeypatch) -> None:
    target_file, draft_file = files(tmp_path)
    other_target, _ = files(tmp_path, "other.gguf")
    sampled = SamplingParams(temperature=0.8)
    paths = {learnt_path(target_file, draft_file, GREEDY), learnt_path(target_file, draft_file, sampled),
             learnt_path(other_target, draft_file, GREEDY), learnt_path(target_file, None, GREEDY),
             learnt_path(SimpleNamespace(**{**vars(target_file), "options": SimpleNamespace(n_threads=1)}), draft_file, GREEDY)}
    assert len(paths) == 5 and all(path.parent == cache / "remembered" for path in paths)
    monkeypatch.setenv(COLD_START, "1")
    policy = calibrated(MEMORY_BOUND, {"model": 0.3})
    learn(policy, "model", 8, 8, 3)
    LearntFile(target_file, draft_file, print).keep(policy, GREEDY, now=True)
    assert not (cache / "remembered").exists()


@pytest.mark.parametrize("content, why", [
    (b"{not json", "damaged (not a policy file's JSON)"),
    (b'{"format": 1, "learnt": {}}', "not a speccli policy file of this version"),
    (json.dumps({"format": 2, "learnt": {"keys": {"model": {"model": True, "schedule": {"idle_steps": "x"},
                                                              "acceptance": {}, "cost": {}}},
                                         "reply_lengths": [], "reply_tokens": 0}}).encode(), "idle_steps is 'x'"),
    (json.dumps({"format": 2, "learnt": {"keys": {}, "reply_lengths": [-3], "reply_tokens": 0}}).encode(), "reply lengths are not counts"),
    (json.dumps({"format": 2, "learnt": {"keys": {"model": {"model": True, "schedule": {"last_kept": 2.5},
                                                              "acceptance": {"judged_at": [1e999]}, "cost": {}}},
                                         "reply_lengths": [], "reply_tokens": 0}}).encode(), "last_kept is 2.5"),
    (b"\xff\xfe", "damaged (not a policy file's JSON)"),
    (b'{"format": 2}', "damaged (KeyError: 'learnt')"),
    (json.dumps({"format": 2, "learnt": {"keys": {}, "reply_lengths": [], "reply_tokens": 0},
                 "costs": {"decode_seconds": [[2, 0.1]], "sample_seconds": 0, "draft_costs": {}, "asked": [2]}}).encode(),
     "the profile has no one-row decode"),
    (json.dumps({"format": 2, "learnt": {"keys": {}, "reply_lengths": [], "reply_tokens": 0},
                 "costs": {"decode_seconds": [[1, -0.1]], "sample_seconds": 0, "draft_costs": {}, "asked": [1]}}).encode(),
     "-0.1 is not seconds"),
])
def test_a_file_that_cannot_serve_is_one_line_and_a_fresh_start(cache, tmp_path, content, why) -> None:
    target_file, draft_file = files(tmp_path)
    path = learnt_path(target_file, draft_file, GREEDY)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    warned, policy = [], AutoK()
    LearntFile(target_file, draft_file, warned.append).recall(policy, GREEDY)
    assert warned == [f"warning: {path}: {why}; `auto` starts from its priors"] and policy.keys == {}


def test_a_folder_where_the_file_goes_is_said_and_not_written_again(cache, tmp_path) -> None:
    target_file, draft_file = files(tmp_path)
    path = learnt_path(target_file, draft_file, GREEDY)
    path.mkdir(parents=True)
    warned, policy = [], calibrated(MEMORY_BOUND, {"model": 0.3})
    learnt = LearntFile(target_file, draft_file, warned.append)
    learnt.recall(policy, GREEDY)
    learnt.keep(policy, GREEDY, now=True)
    learnt.keep(policy, GREEDY, now=True)
    assert warned[0] == f"warning: {path}: unreadable (Is a directory); `auto` starts from its priors"
    assert len(warned) == 2 and warned[1].startswith(f"warning: {path}: cannot be written")  # said once


def test_remembered_lists_and_clears_what_auto_learnt(cache, tmp_path) -> None:
    target_file, draft_file = files(tmp_path)
    policy = calibrated(MEMORY_BOUND, {"model": 0.3})
    two_threads = SimpleNamespace(**{**vars(target_file), "options": SimpleNamespace(n_threads=2)})
    for target in (target_file, two_threads):  # one pair, two files: their lines tell them apart
        LearntFile(target, draft_file, print).keep(policy, GREEDY, now=True)
    path, other = learnt_path(target_file, draft_file, GREEDY), learnt_path(two_threads, draft_file, GREEDY)
    fifo = cache / "remembered" / "fifo.policy"
    os.mkfifo(fifo)  # a read of it would block for ever
    listed = CliRunner().invoke(app, ["remembered"])
    assert listed.exit_code == 0 and listed.stdout.splitlines() == sorted([
        f"{path}  what auto learnt: target.gguf + a-draft (greedy, CPU, every core)",
        f"{other}  what auto learnt: target.gguf + a-draft (greedy, CPU, 2 threads)", f"{fifo}  ? (not a policy file)"])
    cleared = CliRunner().invoke(app, ["remembered", "--clear"])
    assert cleared.exit_code == 0 and cleared.stdout == f"deleted 3 files from {cache / 'remembered'}\n"
    assert not path.exists()


def test_a_running_process_never_writes_back_what_clear_deleted(cache, tmp_path) -> None:
    """`remembered --clear` while a chat or server runs: at its next save it wrote the file again, from
    what it had learnt before the clear, whether or not it had written one before. A process started
    after the clear writes its own."""
    target_file, draft_file = files(tmp_path)
    policy = calibrated(MEMORY_BOUND, {"model": 0.3})
    path = learnt_path(target_file, draft_file, GREEDY)
    wrote, never_wrote = LearntFile(target_file, draft_file, print), LearntFile(target_file, draft_file, print)
    wrote.keep(policy, GREEDY, now=True)
    assert path.exists()
    assert CliRunner().invoke(app, ["remembered", "--clear"]).exit_code == 0
    for running in (wrote, never_wrote):
        running.keep(policy, GREEDY, now=True)
        assert not path.exists()
    LearntFile(target_file, draft_file, print).keep(policy, GREEDY, now=True)
    assert path.exists()
    assert stat.S_IMODE((cache / "remembered").stat().st_mode) == 0o700  # it names the user's models


def test_a_one_shot_chat_keeps_what_auto_learnt_and_the_next_takes_it_up(cache, tiny_pair) -> None:
    """Through the command: the first `chat -p` writes the file; a damaged one is one line on stderr, the
    reply given all the same, and the file written anew."""
    from tests.test_chat import chat

    first = chat(tiny_pair, "-p", "hello", "-n", "12", "--seed", "1", "--k", "auto")
    assert first.exit_code == 0, first.stderr
    [kept] = (cache / "remembered").glob("*.policy")
    saved = json.loads(kept.read_text())
    assert saved["regime"] == "sampled" and "model" in saved["learnt"]["keys"] and "model" in saved["costs"]["draft_costs"]
    kept.write_text("{")
    second = chat(tiny_pair, "-p", "hello", "-n", "12", "--seed", "1", "--k", "auto")
    assert second.exit_code == 0 and second.stdout
    assert f"warning: {kept}: damaged (not a policy file's JSON); `auto` starts from its priors" in second.stderr.splitlines()
    assert json.loads(kept.read_text())["format"] == FORMAT


def test_a_restarted_server_takes_up_the_profile_and_times_none(cache, tmp_path, monkeypatch) -> None:
    """Through a real server with two slots: the first process times the profile and keeps it as it
    stops; the next one answers without timing (the control: the first one's timing is seen)."""
    from contextlib import ExitStack

    from speccli.core import generator as generator_module
    from speccli.llama.model import LoadOptions, Model
    from speccli.server.launch import ServeSettings, build_service, serving_in_thread
    from tests.test_server import MODEL, client
    from tests.tiny_gguf import write_related_pair

    timed, measure = [], generator_module.measure_costs
    monkeypatch.setattr(generator_module, "measure_costs", lambda *args: timed.append(args) or measure(*args))
    paths = write_related_pair(tmp_path, target_layers=2, draft_layers=1, eps=0.1)
    for process in range(2):
        with ExitStack() as stack:
            options = LoadOptions(n_ctx=512, n_threads=1, n_seq=2)
            target = stack.enter_context(Model(paths[0], options))
            draft = stack.enter_context(Model(paths[1], options))
            service = build_service(MODEL, target, draft, ServeSettings(port=0, spec="model", parallel=2))
            url = stack.enter_context(serving_in_thread(service))
            reply = client(url).completions.create(model=MODEL, prompt="tell me about the sea", max_tokens=8, temperature=0)
            assert reply.choices[0].text
        assert len(timed) == 1, process  # timed by the first process only
    [kept] = (cache / "remembered").glob("*.policy")
    assert "model" in json.loads(kept.read_text())["costs"]["draft_costs"]
