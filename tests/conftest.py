"""Shared fixtures: tiny real GGUF models (tests/tiny_gguf.py), written once per test session; `auto`
with pretended costs for the engine tests; and the lanes' markers, set by rule (see
`pytest_collection_modifyitems`)."""
from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

from speccli.core.stats import StepEvent
from speccli.llama.model import KVSequence, LoadOptions, Model
from speccli.models.config import load_registry
from speccli.models.resolve import resolve_pair
from speccli.core.seam import CostProfile, Draft, DraftCosts
from speccli.remembered.learnt import COLD_START
from speccli.drafting.policy import AutoK
from tests.tiny_gguf import TinyConfig, write_related_pair, write_tiny_gguf


# What `auto` learnt is kept between processes (speccli/remembered/learnt.py): tests, and the commands they
# start, begin from the priors every run, whatever an earlier run left in the cache. The tests of the
# warm start itself take this out of their environment.
os.environ[COLD_START] = "1"


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background by a shell without job control (`bash -c 'pytest &'`) begins
    # with SIGINT ignored, and every child it starts would too (exec keeps an ignored signal ignored):
    # the tests that press Ctrl-C on a child then fail, the child still running. Deliver it as a
    # terminal would. (speccli, as Python does, leaves SIGINT ignored where it starts so.)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# --- lanes -----------------------------------------------------------------------------------------
# `pytest -m fast` runs every test but those on the real Gemma or Qwen pair and the slow ones: it needs
# no weights but the tiny models tests/tiny_gguf.py writes. Marked here by rule, so a new test joins the
# fast lane unless it uses a real pair's fixture, is marked gemma, qwen or slow, or is listed below.

# Fixtures that load a real pair's files, and the marker each gives the tests that use them (directly
# or through another fixture).
REAL_PAIR_FIXTURES = {
    "gemma_pair": "gemma", "gemma_file": "gemma", "gemma": "gemma",  # `gemma`: test_quant_check.py's F32 files
    "qwen_pair": "qwen", "qwen_files": "qwen", "qwen_file": "qwen",
}
# Tests that took over 3 s (setup, call and teardown together) in one run of the whole suite on the
# shared 2-core machine (`pytest -p no:randomly --durations=0`, at a load of 7), by node id; an id
# without its parameters ("[...]") covers all of them. Not listed: test_generator.py's chi-square tests,
# 6.5 s there at 3000 samples, since cut to 2000 (1.1-1.3 s in a fast-lane run at a load of 3): the fast
# lane's check of the whole loop's exactness.
SLOW_TESTS = frozenset({
    "tests/test_engine_distribution_steps.py::test_auto_k_with_a_length_cut_where_the_target_would_reject_is_detected",  # 18 s
    "tests/test_engine_distribution_steps.py::test_top_p_and_min_p_under_auto_give_the_targets_first_three_tokens",  # 6-7 s each
    "tests/test_engine_distribution_steps.py::test_auto_k_over_real_sources_gives_the_targets_first_three_tokens",  # 4-6 s each
    "tests/test_engine_distribution_steps.py::test_what_k_per_step_could_break_is_detected_in_the_first_three_tokens",  # 2-4 s each
    "tests/test_engine_distribution_steps.py::test_the_bonus_after_three_kept_drafts_is_the_targets",  # 3 s each
    "tests/test_bench.py::test_greedy_check_catches_a_diverging_engine",  # 3.5 s
    "tests/test_bench.py::test_spec_list_and_auto_in_one_run",  # 4.0 s
    "tests/test_bench.py::test_sweep_reports_each_k_best_and_chart",  # 3.0 s
    "tests/test_bench_output.py::test_a_closed_stdout_never_costs_the_json_file",  # 3.6 s
    "tests/test_bench_output.py::test_json_to_stdout_moves_the_human_report_to_stderr",  # 4.3 s
    "tests/test_bench_output.py::test_json_to_stdout_whose_reader_went_away_is_kept_and_named",  # 5.1 s
    "tests/test_bench_output.py::test_k4_report_validates_against_the_schema_generated_from_the_types",  # 3.4 s
    "tests/test_chat.py::test_a_one_shot_reply_interrupted_is_printed_and_exits_as_interrupted",  # 4.9 s
    "tests/test_chat.py::test_ctrl_c_during_a_piped_reply_ends_the_session_as_interrupted",  # 5.0 s
    "tests/test_chat.py::test_ctrl_c_while_a_piped_chat_waits_for_its_next_line_shows_the_session_first",  # 4.6 s
    "tests/test_chat.py::test_live_display_and_ctrl_c_in_a_real_terminal",  # 3.1 s
    "tests/test_cli_errors.py::test_a_full_stdout_is_named[command0]",  # 3.2 s
    "tests/test_cli_errors.py::test_a_model_trained_with_less_than_the_least_context_is_refused_before_loading",  # 4.9 s
    "tests/test_cli_errors.py::test_a_reader_that_went_away_is_exit_141_without_a_word",  # 6.1 s
    "tests/test_cli_errors.py::test_debug_adds_the_traceback_and_changes_no_exit_code",  # 3.7 s
    "tests/test_engine_distribution.py::test_a_taken_over_draft_verified_without_removing_a_rejected_lookup_token_is_detected",  # 15.5 s
    "tests/test_engine_distribution.py::test_model_drafts_a_lookup_takes_over_match_the_target_distribution",  # 14.2 s
    "tests/test_engine_distribution.py::test_ngram_and_model_under_auto_k_match_the_target_distribution",  # 14.7 s
    "tests/test_engine_distribution.py::test_ngram_drafts_match_the_target_distribution",  # 15.7 s
    "tests/test_engine_distribution.py::test_ngram_resampling_that_keeps_the_rejected_token_is_detected",  # 11.5 s
    "tests/test_engine_distribution.py::test_raw_draft_logits_bug_is_detected",  # 17.8 s
    "tests/test_engine_distribution.py::test_skipping_the_residual_is_detected",  # 16.3 s
    "tests/test_engine_distribution.py::test_speculative_sampling_matches_the_target_distribution",  # 24.7 s
    "tests/test_engine_distribution.py::test_target_only_sampling_matches_too",  # 7.4 s
    "tests/test_gguf_meta.py::test_llama_cpp_vocab_file_reads_the_same_as_gguf_reader",  # 9.6 s
    "tests/test_registry.py::test_a_built_file_cut_short_since_is_not_pulled_and_is_built_again",  # 4.1 s
    "tests/test_registry.py::test_a_corrupt_part_is_named",  # 4.0 s
    "tests/test_registry.py::test_a_pin_that_differs_only_in_its_last_digit_never_reuses_the_file_built_for_the_right_one",  # 4.0 s
    "tests/test_registry.py::test_an_interrupted_chunked_pull_resumes_without_fetching_finished_parts",  # 3.2 s
    "tests/test_registry.py::test_two_cold_runs_at_once_build_a_derived_model_once",  # 3.8 s
    "tests/test_server.py::test_a_full_queue_answers_503_with_retry_after_rather_than_hanging",  # 13.7 s
    "tests/test_server.py::test_a_queue_of_zero_serves_one_request_at_a_time_and_refuses_the_rest",  # 6.2 s
    "tests/test_tiny_gguf.py::test_greedy_agreement_falls_as_eps_grows",  # 15.9 s
    "tests/test_device_check.py::test_every_step_runs_and_passes_and_the_report_shows_each",  # 11.3 s, 2026-12-04
    # Timed alone on an idle machine (2 cores), 2026-12-02:
    "tests/test_rpc.py::test_sampling_with_the_target_over_rpc_gives_the_targets_distribution",  # 29.3 s
    "tests/test_rpc.py::test_a_server_lost_mid_reply_makes_serve_answer_503_and_say_why_on_health",  # 4.4 s
    "tests/test_rpc.py::test_the_draft_goes_to_the_server_only_when_asked_and_quant_check_runs_there",  # 4.1 s
    "tests/test_rpc.py::test_a_server_lost_mid_reply_ends_chat_with_one_line_and_keeps_the_reply_so_far",  # 4.0 s
    "tests/test_rpc.py::test_a_server_of_another_protocol_or_none_is_named[silent]",  # 4.0 s: the 3 s timeout
    "tests/test_rpc.py::test_a_server_lost_mid_bench_is_one_line_and_exit_1",  # 3.5 s
    # Timed in a fast-lane run on an AMD EPYC machine (2 cores), 2026-12-02 (the lane took 5 min):
    "tests/test_engine_distribution_steps.py::test_stale_cache_entries_are_detected_in_tokens_two_and_three",  # 15.3 s
    "tests/test_engine_distribution_steps.py::test_model_drafts_at_k2_give_the_targets_first_three_tokens",  # 9.9 s
    "tests/test_translated.py::test_translated_drafts_give_the_targets_first_three_tokens",  # 11-13 s each
    "tests/test_translated.py::test_a_broken_translation_engine_is_detected",  # 9-13 s each
    "tests/test_generator.py::test_the_first_two_tokens_follow_the_targets_exact_distribution",  # 4-5.5 s each
    # Timed in a run of the file alone, 2026-12-05:
    "tests/test_grammar.py::test_replies_under_the_grammar_follow_the_law",  # 10-15 s each
    "tests/test_grammar.py::test_a_broken_grammar_engine_fails_the_law[mask_after_the_filters]",  # 12-14 s
    "tests/test_grammar.py::test_a_thousand_sampled_replies_under_a_schema_are_all_valid",  # 23 s
})
# A `-m fast` run fails a test that loads weights from a file larger than this (the tiny models are
# under 2 MB; Gemma 3 270M Q4_K_M is 242 MB). Models loaded by a subprocess are not seen.
REAL_WEIGHTS_BYTES = 32 << 20


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in REAL_PAIR_FIXTURES.keys() & set(item.fixturenames):
            item.add_marker(REAL_PAIR_FIXTURES[fixture])
        if item.nodeid in SLOW_TESTS or item.nodeid.split("[")[0] in SLOW_TESTS:
            item.add_marker("slow")
        if not any(item.get_closest_marker(name) for name in ("gemma", "qwen", "slow")):
            item.add_marker("fast")


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a run that selects the fast lane by marker (`-m fast`), refuse to load real weights in-process:
    a test that needs them belongs in another lane (mark it, or list it in SLOW_TESTS)."""
    selected = session.items
    if not session.config.option.markexpr or not selected or not all(item.get_closest_marker("fast") for item in selected):
        return
    import speccli.llama.model
    import speccli.llama.tokenizer

    load_model = speccli.llama.tokenizer.load_model

    def tiny_weights_only(path, *, vocab_only, **options):
        if not vocab_only and Path(path).stat().st_size > REAL_WEIGHTS_BYTES:
            pytest.fail(f"a fast-lane test loaded the weights of {path}: mark it gemma, qwen or slow "
                        "(tests/conftest.py)", pytrace=False)
        return load_model(path, vocab_only=vocab_only, **options)

    patch = pytest.MonkeyPatch()
    for module in (speccli.llama.model, speccli.llama.tokenizer):
        patch.setattr(module, "load_model", tiny_weights_only)
    session.config.add_cleanup(patch.undo)


# --- engine tests' helpers ------------------------------------------------------------------------------

PRETENDED_DECODE_SECONDS = 1e-3
PRETENDED_DRAFT_TOKEN_SECONDS = 2e-4


class MemoryBoundAutoK(AutoK):
    """`auto` as on a GPU: verifying n tokens costs nearly one decode, a drafted token a fifth of one.
    On these tiny CPU models drafting rarely pays, so the real costs would mostly choose k = 0; these
    make the policy choose varied lengths from the acceptance it sees, which is what the tests need to
    exercise. Timings never move them: a busy moment on the machine must not change what a test drafts
    (a slow first draft decode once made the tiny pair's auto test draft too little)."""

    def calibrate(self, costs):
        super().calibrate(CostProfile(
            {n: PRETENDED_DECODE_SECONDS * (1 + 0.02 * n) for n in costs.decode_seconds},
            {key: DraftCosts(PRETENDED_DRAFT_TOKEN_SECONDS, {}) for key in costs.draft_costs},  # catch-ups free
        ))
        self.verify.update = lambda *timings: None  # keep the pretended curve; acceptance still adapts

    def observe(self, draft: Draft, step: StepEvent, yielded) -> None:
        super().observe(draft, step, yielded)
        key = draft.segments[0].key if draft.segments else ""
        if key in self.keys and self.keys[key].cost.token_seconds:  # a draft model: keep its pretended cost
            self.keys[key].cost.token_seconds = PRETENDED_DRAFT_TOKEN_SECONDS


def widest_verify_timings(monkeypatch: pytest.MonkeyPatch, target: Path) -> list[int]:
    """A list that gets an entry for every timed decode of 25 rows of `target` from now on: a cost
    profile's widest verify (`KVSequence.time_decode`, the cost probe, a model's own included)."""
    timings = []
    time_decode = KVSequence.time_decode

    def counting(model, tokens, n_logit_rows):
        if model.path == target and len(tokens) == 25:
            timings.append(n_logit_rows)
        return time_decode(model, tokens, n_logit_rows)

    monkeypatch.setattr(KVSequence, "time_decode", counting)
    return timings


@pytest.fixture(scope="module")
def gemma_pair():
    """The bundled default pair, loaded: Gemma 3 270M F32 target, its Q4_K_M draft."""
    resolved = resolve_pair(None, None, None, load_registry(), quiet=True)
    options = LoadOptions(n_ctx=512)
    with Model(resolved.target_path, options) as target, Model(resolved.draft_path, options) as draft:
        yield target, draft


class TinyPair(NamedTuple):
    target: Path
    draft: Path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> Path:
    """One tiny llama model: vocab 512, width 64, 2 layers (~0.4 MB, writes and loads in milliseconds)."""
    return write_tiny_gguf(tiny_dir / "tiny.gguf", TinyConfig())


@pytest.fixture(scope="session")
def tiny_pair(tiny_dir: Path) -> TinyPair:
    """A related pair: an 8-layer target and a 2-layer draft equal to its first 2 layers, eps 0.05
    (greedy agreement ~0.89, see write_related_pair)."""
    target, draft = write_related_pair(tiny_dir / "pair", target_layers=8, draft_layers=2, eps=0.05)
    return TinyPair(target, draft)


@contextmanager
def loaded_related_pair(directory: Path, *, target_layers: int, draft_layers: int, eps: float):
    """A related pair written to `directory` and loaded: (target, draft) Models, one thread each,
    llama.cpp's smallest context (256)."""
    from speccli.llama.model import LoadOptions, Model

    target_path, draft_path = write_related_pair(directory, target_layers=target_layers, draft_layers=draft_layers, eps=eps)
    options = LoadOptions(n_ctx=256, n_threads=1)
    with Model(target_path, options) as target, Model(draft_path, options) as draft:
        yield target, draft
