"""Drafts of another vocabulary (speccli/drafting/translated.py): the draft's text, re-tokenized by the
target, verified as proposals made with certainty. Exact by enumeration through the real translation
and the real verify rule, by χ² on tiny models of two vocabularies, and greedy output equal to the
target alone's on real models of two families; each exactness test beside a broken engine it catches."""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from speccli.core import generator as generator_module
from speccli.core.generator import Generator
from speccli.core.parting import find_parting
from speccli.core.sampling import Distribution, SamplingParams
from speccli.core.verify import DraftVerdict, sample, verify_sampled, without_token
from speccli.core.seam import Plan
from speccli.drafting.policy import FixedK
from speccli.drafting.specs import make_drafter
from speccli.vocab.check import vocabularies_differ
from speccli.drafting import translated as translated_module
from speccli.drafting.planner import Planner
from speccli.drafting.translated import TranslatedDrafter
from speccli.vocab.shared import SharedTokens, on_shared_tokens
from speccli.llama.model import LoadOptions, Model
from speccli.llama.tokenizer import load_vocab_only
from speccli.vocab.info import read_vocab
from speccli.vocab.shared import shared_vocabulary
from speccli.vocab.translate import translate
from tests.test_engine_greedy import PROMPTS, greedy_tokens, reference_tokens
from tests.test_verify_exact import TinyLanguageModel, step_distribution, target_sequences
from tests.tiny_gguf import TinyConfig, gpt2_vocabulary, write_tiny_gguf
from tests.token_distribution import chi_square_p_value, exact_distribution, sample_generations

GREEDY = SamplingParams(temperature=0)
SETTINGS = SamplingParams(temperature=0.7, top_k=12)


@pytest.fixture(scope="module")
def two_vocabularies(tmp_path_factory):
    """(target, draft) tiny models: a SentencePiece vocabulary and a byte-level BPE one, 512 tokens each."""
    directory = tmp_path_factory.mktemp("translated")
    target = write_tiny_gguf(directory / "target-spm.gguf", TinyConfig(n_layer=4, seed=1))
    draft = write_tiny_gguf(directory / "draft-bpe.gguf", TinyConfig(n_layer=2, seed=2, vocab=gpt2_vocabulary(512)))
    return target, draft


# --- translation ---------------------------------------------------------------------------------------


def test_check_vocab_finds_the_two_vocabularies_differ(two_vocabularies) -> None:
    target, draft = two_vocabularies
    assert vocabularies_differ(draft, target) and not vocabularies_differ(target, target)


def test_drafted_text_becomes_the_target_ids_that_follow_the_context(two_vocabularies) -> None:
    target_path, draft_path = two_vocabularies
    with load_vocab_only(target_path) as target, load_vocab_only(draft_path) as draft:
        context = target.tokenize(b"the cat", add_special=False)
        # The drafted text, from the draft's own tokens: " sat on the mat."
        drafted = draft.detokenize(draft.tokenize(b" sat on the mat.", add_special=False))
        proposal = translate(target, context, drafted)
        assert target.detokenize(proposal) == b" sat on the mat."
        assert context + proposal == target.tokenize(b"the cat sat on the mat.", add_special=False)
        # Ending inside a word, the word is left out: " ma" could have become " mat", other tokens.
        assert target.detokenize(translate(target, context, b" sat on the ma")) == b" sat on the"
        assert translate(target, context, b"ma") == []


# --- the enumeration -----------------------------------------------------------------------------------

DRAFT_TEXTS = [b" a", b"b", b" ab", b"ba", b".", b" ca"]  # the draft's tokens, as text


def translated_step(target_vocabulary, draft: TinyLanguageModel, target: TinyLanguageModel, ids: list[int], k: int,
                    verify=verify_sampled) -> tuple[dict[tuple[int, ...], float], int]:
    """The exact distribution of the first n target tokens after the context "x", and n: every sequence
    of k draft tokens (over DRAFT_TEXTS, drawn from `draft`), translated by the real translation
    into target ids, verified with certainty by the real rule (its verdicts read off the whole partition
    of its uniforms), then topped up with target-only tokens to n, one past the longest proposal.
    `target` is over positions in `ids` (the target ids it may emit)."""
    context = target_vocabulary.tokenize(b"x", add_special=False)
    proposals = {}
    for drafted in itertools.product(range(len(DRAFT_TEXTS)), repeat=k):
        text = b"".join(DRAFT_TEXTS[token] for token in drafted)
        proposals[drafted] = [ids.index(token) for token in translate(target_vocabulary, context, text)]
    length = max(map(len, proposals.values())) + 1
    joint: dict[tuple[int, ...], float] = {}
    for drafted, proposal in proposals.items():
        drafted_probability = np.prod([draft(drafted[:i])[token] for i, token in enumerate(drafted)])
        p_rows = np.array([target(tuple(proposal[:i])) for i in range(len(proposal) + 1)])
        for emitted, probability in step_distribution(proposal, None, p_rows, verify).items():
            for completion, completion_probability in target_sequences(target, emitted, length):
                joint[completion] = joint.get(completion, 0.0) + drafted_probability * probability * completion_probability
    return joint, length


def target_ids_of_every_translation(target_vocabulary, k: int) -> list[int]:
    context = target_vocabulary.tokenize(b"x", add_special=False)
    found = {token for drafted in itertools.product(DRAFT_TEXTS, repeat=k)
             for token in translate(target_vocabulary, context, b"".join(drafted))}
    return sorted(found) + [target_vocabulary.eos_id]  # one the drafts never propose


def accepting_certain_tokens_half_again_as_often(drafted, q, p, rng) -> DraftVerdict:
    """Broken: a token proposed with certainty is kept with probability min(1, 1.5 p(x))."""
    uniforms = rng.random(len(drafted))
    for i, token in enumerate(drafted):
        if not uniforms[i] < min(1.0, 1.5 * p[i][token]):
            return DraftVerdict(i, sample(without_token(p[i], token), rng))
    return DraftVerdict(len(drafted), sample(p[len(drafted)], rng))


def worst_error(target_path, k: int, seed: int, verify) -> float:
    """The largest difference between the target's exact distribution and that of a translated step."""
    with load_vocab_only(target_path) as target_vocabulary:
        ids = target_ids_of_every_translation(target_vocabulary, k)
        target = TinyLanguageModel(seed, len(ids), 0.0)
        draft = TinyLanguageModel(seed + 100, len(DRAFT_TEXTS), 0.0)
        speculative, length = translated_step(target_vocabulary, draft, target, ids, k, verify)
    exact = dict(target_sequences(target, (), length))
    return max(abs(speculative.get(sequence, 0.0) - probability) for sequence, probability in exact.items())


@pytest.mark.parametrize("k, seed", [(1, 0), (2, 1), (2, 2)])
def test_a_step_of_translated_drafts_is_exact(two_vocabularies, k, seed) -> None:
    assert worst_error(two_vocabularies[0], k, seed, verify_sampled) < 1e-12


@pytest.mark.parametrize("k, seed", [(1, 0), (2, 1)])
def test_the_enumeration_catches_a_rule_biased_towards_translated_drafts(two_vocabularies, k, seed) -> None:
    """The same enumeration with certain tokens kept at min(1, 1.5 p(x)): the rule's verdicts change inside
    the cells its definition draws (the enumeration says so), or the distribution moves."""
    try:
        worst = worst_error(two_vocabularies[0], k, seed, accepting_certain_tokens_half_again_as_often)
    except AssertionError as caught:
        assert "within the cell of" in str(caught)
        return
    assert worst > 1e-3, "the enumeration cannot tell a biased rule from the real one"


def shared_token_step(shared, draft: TinyLanguageModel, draft_ids: list[int], target: TinyLanguageModel,
                      target_ids: list[int], k: int, verify=verify_sampled, restrict=on_shared_tokens):
    """The exact distribution of k+1 target tokens from one TLI step: the draft (over `draft_ids`, a few of
    its real vocabulary's ids, shared or not) restricted by the real `on_shared_tokens`, each sequence of k
    tokens drawn from that (on the target's ids, through the real shared vocabulary), verified with the
    distribution it reports as q by the real rule, then topped up with the target alone. `target` is over
    positions in `target_ids`."""
    tokens = SharedTokens(shared, 512)
    joint: dict[tuple[int, ...], float] = {}

    def restricted_row(prefix: tuple[int, ...]):
        """The draft's row after `prefix` (target ids drafted so far), restricted: drawn from and reported as q."""
        full = np.zeros(max(int(shared.draft_ids.max()), *draft_ids) + 1)
        full[draft_ids] = draft(tuple(draft_ids.index(tokens.draft_of_target[t]) for t in prefix))
        return restrict(Distribution.on_support(full), tokens)

    def grow(prefix: tuple[int, ...], probability: float):
        if len(prefix) == k:
            yield prefix, probability
            return
        row = restricted_row(prefix)
        for token, weight in zip(row.ids.tolist(), row.weights / row.weights.sum()):  # a draw normalises the weights
            yield from grow(prefix + (token,), probability * weight)

    for chosen, probability in grow((), 1.0):
        proposal = [target_ids.index(token) for token in chosen]
        q_rows = np.zeros((k, len(target_ids)))
        for position in range(k):
            reported = restricted_row(chosen[:position])
            for token in reported.ids.tolist():
                q_rows[position][target_ids.index(token)] = reported[token]
        p_rows = np.array([target(tuple(proposal[:i])) for i in range(k + 1)])
        for emitted, emitted_probability in step_distribution(proposal, q_rows, p_rows, verify).items():
            for completion, completion_probability in target_sequences(target, emitted, k + 1):
                joint[completion] = joint.get(completion, 0.0) + probability * emitted_probability * completion_probability
    return joint


def tli_error(two_vocabularies, k: int, seed: int, restrict=on_shared_tokens) -> float:
    target_path, draft_path = two_vocabularies
    shared = shared_vocabulary(read_vocab(draft_path), read_vocab(target_path))
    drafts = [int(d) for d in shared.draft_ids[100:103]]  # three shared tokens ...
    not_shared = [d for d in range(300, 512) if d not in set(shared.draft_ids.tolist())][:1]  # ... and one not
    draft_ids = drafts + not_shared
    target_ids = [int(shared.target_ids[list(shared.draft_ids).index(d)]) for d in drafts] + [3, 4]
    target = TinyLanguageModel(seed, len(target_ids), 0.0)
    draft = TinyLanguageModel(seed + 100, len(draft_ids), 0.0)
    speculative = shared_token_step(shared, draft, draft_ids, target, target_ids, k, restrict=restrict)
    exact = dict(target_sequences(target, (), k + 1))
    return max(abs(speculative.get(sequence, 0.0) - probability) for sequence, probability in exact.items())


@pytest.mark.parametrize("k, seed", [(1, 0), (2, 1)])
def test_a_step_of_shared_token_drafts_is_exact(two_vocabularies, k, seed) -> None:
    assert tli_error(two_vocabularies, k, seed) < 1e-6  # q rows are float32, as the engine's


def test_the_enumeration_catches_shared_tokens_left_unnormalised(two_vocabularies) -> None:
    def unnormalised(q, shared):  # the restricted weights reported as probabilities, without their sum
        restricted = on_shared_tokens(q, shared)
        return Distribution(restricted.ids, restricted.weights, restricted.size, 1.0)

    try:
        worst = tli_error(two_vocabularies, 2, 1, restrict=unnormalised)
    except AssertionError as caught:
        assert "within the cell of" in str(caught)
        return
    assert worst > 1e-3


# --- sampling on real tiny models ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(two_vocabularies, tmp_path_factory):
    """(target, draft of another vocabulary): the draft is the target's own layers, its token rows moved
    to its ids of the same text (other rows the target's at the same id), so that its proposals are
    often kept: a broken verify of them then shows in the output."""
    target_path, draft_path = two_vocabularies
    shared = shared_vocabulary(read_vocab(draft_path), read_vocab(target_path))
    rows = list(range(512))
    for draft_id, target_id in zip(shared.draft_ids.tolist(), shared.target_ids.tolist()):
        rows[draft_id] = target_id
    related = write_tiny_gguf(tmp_path_factory.mktemp("related") / "draft-bpe-related.gguf",
                              TinyConfig(n_layer=4, seed=1, vocab=gpt2_vocabulary(512), token_rows=tuple(rows)))
    options = LoadOptions(n_ctx=256, n_threads=1)
    with Model(target_path, options) as target, Model(related, options) as draft:
        yield target, draft


MODES = ["text", "shared tokens"]


def drafter_for(mode: str, target: Model, draft: Model) -> Planner:
    shared = None if mode == "text" else shared_vocabulary(read_vocab(draft.path), read_vocab(target.path))
    return Planner(model=TranslatedDrafter(draft, target.tokenizer, shared))


# Draws: the subtler control (q drawn at twice the temperature) needs about 3,100
# (tests/benchmarks/RESULTS.md, *Chi-square power*).
DRAWS = 3200


def first_three(target, draft, mode: str, samples: int = DRAWS, broken=None) -> tuple[float, int, int]:
    prompt = target.tokenizer.tokenize(b"hello world")
    expected = exact_distribution(target, prompt, SETTINGS, 3)
    generator = Generator(target, drafter_for(mode, target, draft), SETTINGS, FixedK(3), seed=7)
    with pytest.MonkeyPatch.context() as patch:
        if broken is not None:
            patch.setattr(*broken)
        generations, stats = sample_generations(generator, prompt, samples, 3)
    generator.reset()
    return chi_square_p_value([g.first(3) for g in generations], expected), stats.positions.drafted, stats.positions.accepted


@pytest.mark.parametrize("mode", MODES)
def test_translated_drafts_give_the_targets_first_three_tokens(loaded, mode) -> None:
    p_value, drafted, kept = first_three(*loaded, mode)
    # Random text of letters seldom re-tokenizes as it was drafted: the text mode's proposals are tested
    # by what the target does with them, kept or not; the shared tokens' q only where they are kept.
    assert drafted > 500 and (mode == "text" or kept > 150), f"{kept} of {drafted} proposed tokens kept"
    assert p_value > 1e-3, f"p={p_value:.2e}"


class EveryFourthStep(FixedK):
    """Drafts every fourth step only: in between, the draft skips what the target says."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.asked, self.catch_ups = 0, []

    def plan(self, key: str, available: int, catch_up: int = 0, owed_prompt: int = 0) -> Plan:
        self.asked += 1
        self.catch_ups.append(catch_up)
        return super().plan(key, available) if self.asked % 4 == 1 else Plan(0)


def test_a_translated_draft_tells_its_reading_from_a_catch_up(loaded) -> None:
    # Re-reading the context as its own tokens is every step's drafting; a catch-up is what it takes in
    # of tokens it skipped (while the lookup drafted): the policy prices that, and the panel shows it.
    target, draft = loaded
    prompt = target.tokenizer.tokenize(b"hello world")
    every_step = Generator(target, drafter_for("text", target, draft), GREEDY, FixedK(3))
    _, _, stats = greedy_tokens(every_step, prompt, 24)
    assert stats.draft_seconds > 0 and stats.catch_up_seconds == 0.0
    policy = EveryFourthStep(3)
    _, _, stats = greedy_tokens(Generator(target, drafter_for("text", target, draft), GREEDY, policy), prompt, 24)
    assert stats.catch_up_seconds > 0 and max(policy.catch_ups[4::4]) >= 2, policy.catch_ups


def keeping_every_certain_token(drafted, q, p, rng) -> DraftVerdict:
    """Broken: proposals made with certainty are all kept (a verify that trusts a translation)."""
    if q is None:
        return DraftVerdict(len(drafted), sample(p[len(drafted)], rng))
    return verify_sampled(drafted, q, p, rng)


def drawn_at_twice_the_temperature(q, rng) -> int:
    """Broken: the token is drawn from its distribution flattened (as at twice its temperature), while the
    distribution reported as its q is the unflattened one (a temperature applied to one and not the other)."""
    return sample(Distribution(q.ids, np.sqrt(q.weights), q.size), rng)


@pytest.mark.parametrize("mode, broken", [
    ("text", (generator_module, "verify_sampled", keeping_every_certain_token)),
    ("shared tokens", (translated_module, "sample", drawn_at_twice_the_temperature)),
], ids=["text: trusted", "shared tokens: q at another temperature"])
def test_a_broken_translation_engine_is_detected(loaded, mode, broken) -> None:
    p_value, _, _ = first_three(*loaded, mode, broken=broken)
    assert p_value < 1e-6, f"p={p_value:.2e}"


# --- greedy on real models of two families ---------------------------------------------------------------


def check_greedy_translated(target: Model, draft: Model, prompts, max_tokens: int = 32) -> str:
    """Speculative K=4 with translated drafts against the target alone: equal, or parted at a near-tie;
    returns the mode the pair drafted in."""
    partings, drafted = [], 0
    for text in prompts:
        prompt = target.tokenizer.tokenize(text)
        reference = reference_tokens(target, prompt, max_tokens)
        drafter = make_drafter("model", draft, target)
        speculative, _, stats = greedy_tokens(Generator(target, drafter, GREEDY, FixedK(4)), prompt, max_tokens)
        drafted += stats.positions.accepted
        parting = find_parting(target, prompt, reference, speculative, 5)
        assert parting is None or parting.near_tie, f"{text!r}: {parting.describe()}"
        if parting is not None:
            partings.append(f"{text!r}: {parting.describe()}")
    assert drafted > 0, "no translated draft token was ever kept: nothing was tested"
    for line in partings:
        warnings.warn(line)
    return "text" if drafter.model.shared is None else "shared tokens"


@pytest.fixture(scope="module")
def qwen_files():
    from speccli.models.config import load_registry
    from speccli.models.resolve import resolve_pair

    return resolve_pair("qwen2.5-coder-1.5b", None, None, load_registry(), quiet=True)


def test_gemma_target_with_the_qwen_draft_keeps_its_greedy_output(gemma_pair, qwen_files) -> None:
    target, _ = gemma_pair
    with Model(qwen_files.draft_path, LoadOptions(n_ctx=512)) as draft:
        assert check_greedy_translated(target, draft, PROMPTS[:4]) == "shared tokens"  # 63% shared


def test_qwen_target_with_the_gemma_draft_keeps_its_greedy_output(gemma_pair, qwen_files) -> None:
    _, gemma_draft = gemma_pair
    with Model(qwen_files.target_path, LoadOptions(n_ctx=512)) as target:
        assert check_greedy_translated(target, gemma_draft, PROMPTS[:4]) == "text"  # 37% shared


def test_bench_names_the_translated_draft_in_its_header_and_json(two_vocabularies, tmp_path) -> None:
    from typer.testing import CliRunner

    from speccli.cli.app import app

    target, draft = two_vocabularies
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe cat sat on\n")
    report = tmp_path / "report.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
        "bench", "-m", str(target), "-md", str(draft), "--spec", "model", "--k", "2", "-n", "8", "--runs", "1",
        "--warmup", "0", "-t", "1", "-c", "256", "--prompts", str(prompts), "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert "another vocabulary: drafts text)" in result.stdout  # the tiny vocabularies share 49.5%: under half
    assert "greedy check: 2/2 speculative outputs identical to the target's own" in result.stdout
    import json

    assert json.loads(report.read_text())["models"]["draft_proposes"] == "text"
