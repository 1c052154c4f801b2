"""Structured output's law and its proofs (core/constraint.py, docs/exactness.md#structured-output).

The law: at each position, the target's logits restricted to what the grammar allows after the reply so
far, then the filters. Here it is written a second time, independently of llguidance: a regular
language checked with Python's `re` (`allowed_after`), on the numpy stand-in pair (tests/standin.py),
whose every row is known without decoding. Proofs, each through `Generator` and the production planner:

- one row read through the grammar is the law's row exactly (no sampling);
- the first three tokens of sampled replies fit the law's exact joint distribution (chi-square), for a
  draft model at K = 4, and lookup + model under `auto`, with the grammar's forced
  tokens drafted first, under top-k so that the order of mask and filters matters;
- broken engines fail the same test (p < 1e-6, or the reply cannot be generated at all): the mask
  applied after the filters, the mask on the draft's rows only, no rollback of the draft's tokens, a
  step's masks kept into the next;
- greedy replies under the grammar are the target alone's, draft source by draft source, and the law's
  (an argmax over the wrong allowed id fails it);
- 1,000 sampled replies under a JSON schema, every one that ended by itself valid (jsonschema).
"""
from __future__ import annotations

import json
import re
from contextlib import contextmanager

import jsonschema
import numpy as np
import pytest

from speccli.core.constraint import ConstrainedRows, Constraint, Grammar, GrammarError, GrammarSpec, check_grammar
from speccli.core.generator import GenerationLimits, Generator
from speccli.core.sampling import SamplingParams, distribution, greedy_token, probabilities
from speccli.core.stats import FORCED, DoneEvent, StepEvent, TokenEvent
from speccli.drafting.model import ModelDrafter
from speccli.drafting.ngram import NgramLookup
from speccli.drafting.planner import Planner
from speccli.drafting.policy import FixedK
from tests.conftest import MemoryBoundAutoK
from tests.standin import EOG, related_draft, stand_in
from tests.token_distribution import chi_square_p_value

# Units "ab", "cd" or "e", one or more, then ".": after "a" the grammar forces "b", after "c" "d";
# elsewhere it allows two to four tokens, so top-k 3 truncates only among legal tokens.
LARK = 'start: ("ab" | "cd" | "e")+ "."'
LANGUAGE = re.compile(r"(ab|cd|e)+\.")
VIABLE = re.compile(r"(ab|cd|e)*(a|c)?")
SETTINGS = SamplingParams(temperature=0.9, top_k=3)
SAMPLES = 1200  # the weakest control's chi-square was 969 at 2,000 draws
LENGTH = 3


@pytest.fixture(scope="module")
def pair():
    # The end of generation likelier than by default: a reply may end after its first unit's ".".
    target = stand_in(n_vocab=75, seed=4, scale=1.5, eog_bias=1.0)  # each character once, JSON's too
    # The language's characters about as likely as the rest: the raw top 3 holds some of them and some
    # others, so masking before the filters and after them give different rows.
    target.table[:, target.tokenizer.tokenize("abcde.")] += np.float32(2.5)
    return target, related_draft(target, noise=0.7)


@pytest.fixture(scope="module")
def grammar(pair):
    target, _ = pair
    return Grammar(GrammarSpec("grammar", LARK, "the test grammar"), target.tokenizer.grammar_vocabulary(), target.n_vocab)


def allowed_after(tokenizer, text: str) -> np.ndarray:
    """The law's mask, written from the language alone: a character where the text with it can still
    become a sentence of it, the end of generation where the text is one."""
    allowed = np.zeros(tokenizer.n_vocab, dtype=bool)
    allowed[EOG] = LANGUAGE.fullmatch(text) is not None
    for token in range(1, tokenizer.n_vocab):
        longer = text + tokenizer.token_bytes(token).decode()
        allowed[token] = VIABLE.fullmatch(longer) is not None or LANGUAGE.fullmatch(longer) is not None
    return allowed


def law_row(target, prompt: list[int], reply: tuple[int, ...], sampling: SamplingParams) -> np.ndarray:
    """The law's distribution of the token after `prompt + reply`: mask, then the filters."""
    logits = target.next_logits([*prompt, *reply]).copy()
    logits[~allowed_after(target.tokenizer, target.tokenizer.detokenize(reply).decode())] = -np.inf
    return probabilities(logits[None], sampling)[0].astype(np.float64)


def law_joint(target, prompt: list[int], sampling: SamplingParams, length: int = LENGTH) -> dict[tuple[int, ...], float]:
    joint: dict[tuple[int, ...], float] = {}

    def walk(reply: tuple[int, ...], probability: float) -> None:
        row = law_row(target, prompt, reply, sampling)
        for token in np.flatnonzero(row > 0).tolist():
            longer, weight = (*reply, token), probability * row[token]
            if len(longer) == length or token == EOG:
                joint[longer] = weight
            else:
                walk(longer, weight)

    walk((), 1.0)
    return joint


def first_tokens(generator: Generator, prompt: list[int], grammar: Grammar, n: int, length: int = LENGTH) -> list[tuple[int, ...]]:
    """The first `length` tokens of n replies (an end of generation included where it came first)."""
    replies = []
    for _ in range(n):
        tokens = []
        for event in generator.generate(prompt, GenerationLimits(length, grammar=grammar)):
            if isinstance(event, TokenEvent):
                tokens.append(event.token)
            elif isinstance(event, DoneEvent) and event.reason == "eog":
                tokens.append(EOG)
        replies.append(tuple(tokens[:length]))
    return replies


def law_p_value(generator: Generator, prompt: list[int], grammar: Grammar, target, samples: int = SAMPLES) -> float:
    """The chi-square p-value of sampled replies' first tokens against the law; 0 where the engine could not
    generate a reply the law allows (it is as wrong as it gets)."""
    try:
        observed = first_tokens(generator, prompt, grammar, samples)
    except GrammarError:
        return 0.0
    return chi_square_p_value(observed, law_joint(target, prompt, generator.sampling))


PROMPTS = ["ab", "abcde"]  # the lookup finds "ab", "cd" and "e" in the context


def drafters(draft):
    return {
        "target alone": (None, None),
        "model K=4": (Planner(model=ModelDrafter(draft)), FixedK(4)),
        "ngram+model auto": (Planner(lookup=NgramLookup(), model=ModelDrafter(draft)), MemoryBoundAutoK()),
    }


# --- the law, row by row ------------------------------------------------------------------------------

@pytest.mark.parametrize("sampling", [SETTINGS, SamplingParams(temperature=0.7), SamplingParams(temperature=0)],
                         ids=["top-k 3", "dense", "greedy"])
def test_a_row_read_through_the_grammar_is_the_laws_row(pair, grammar, sampling) -> None:
    target, _ = pair
    prompt = target.tokenizer.tokenize("ab")
    for reply_text in ["", "a", "ab", "e", "cde", "abe."]:
        reply = target.tokenizer.tokenize(reply_text)
        constraint = grammar.start()
        constraint.push(reply)
        constraint.settle(reply)
        logits = target.next_logits([*prompt, *reply])[None]
        engine = ConstrainedRows(logits, constraint, []).distribution(0, sampling).dense().astype(np.float64)
        np.testing.assert_allclose(engine, law_row(target, prompt, tuple(reply), sampling), atol=1e-12, err_msg=reply_text)


def test_masking_after_the_filters_is_another_law(pair) -> None:
    """Why the order is part of the law: the filters first (llama.cpp's default), then the grammar among
    what survived, put the mass elsewhere on this pair's rows."""
    target, _ = pair
    prompt = target.tokenizer.tokenize("ab")
    gaps = []
    for text in ["", "ab", "e", "cd", "abe"]:
        reply = tuple(target.tokenizer.tokenize(text))
        law = law_row(target, prompt, reply, SETTINGS)
        filtered_first = probabilities(target.next_logits([*prompt, *reply])[None], SETTINGS)[0].astype(np.float64)
        filtered_first *= allowed_after(target.tokenizer, text)
        if filtered_first.sum() > 0:
            gaps.append(np.abs(filtered_first / filtered_first.sum() - law).max())
    assert max(gaps) > 0.1, gaps


# --- the law, sampled through the engine ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["model K=4", "ngram+model auto"])
def test_replies_under_the_grammar_follow_the_law(pair, grammar, name) -> None:
    target, draft = pair
    drafter, policy = drafters(draft)[name]
    generator = Generator(target, drafter, SETTINGS, policy, seed=11)
    for text in PROMPTS:
        prompt = target.tokenizer.tokenize(text)
        p = law_p_value(generator, prompt, grammar, target)
        assert p > 1e-3, f"{name}, prompt {text!r}: p = {p:.2e}"


def test_the_grammars_forced_tokens_are_drafted_and_kept(pair, grammar) -> None:
    """After "a" and "c" the grammar forces the next token: drafted as the grammar's, always kept (no other
    tokenization is legal here), and counted as their own source."""
    target, draft = pair
    generator = Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(4), seed=2)
    parts = []
    for _ in range(200):
        for event in generator.generate(target.tokenizer.tokenize("ab"), GenerationLimits(12, grammar=grammar)):
            if isinstance(event, StepEvent):
                parts += event.parts()
    forced = [part for part in parts if part.source == FORCED]
    assert forced and all(part.accepted == part.drafted for part in forced)


def whole_row(ids: np.ndarray | None, values: np.ndarray, vocab: int) -> np.ndarray:
    """A row read through the grammar (`ConstrainedRows.read`) as the whole row of the vocabulary."""
    if ids is None:
        return values.copy()
    row = np.full(vocab, -np.inf, dtype=np.float32)
    row[ids] = values
    return row


@contextmanager
def mask_after_the_filters(sampling: SamplingParams = SETTINGS):
    """The filters (`sampling`'s) on the raw row, then the grammar among what survived (all of the
    grammar's tokens where nothing did)."""
    real = ConstrainedRows.read

    def broken(self, index):
        raw = self._logits[index].copy()  # before the mask, which may write into the row itself
        masked = whole_row(*real(self, index), len(raw))
        survivors = distribution(raw, sampling).dense() > 0
        if np.isfinite(masked[survivors]).any():
            masked[~survivors] = -np.inf
        return None, masked

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ConstrainedRows, "read", broken)
        yield


@contextmanager
def mask_on_the_draft_only():
    """The target's rows read unmasked (the state still advanced), the draft's masked."""
    real = ConstrainedRows.read

    def broken(self, index):
        raw = self._logits[index].copy()
        real(self, index)
        return None, raw

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ConstrainedRows, "read", broken)
        yield


@contextmanager
def no_rollback():
    """The draft's tokens stay pushed after drafting: the target's rows are masked at the draft's end."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Constraint, "pop", lambda self, count: None)
        yield


@contextmanager
def masks_kept_into_the_next_step():
    """A step's masks, each computed once for the draft's row and the target's, kept past the verdict:
    the next step reads the last one's (vLLM's stale-mask bug)."""
    real = Constraint.settle

    def broken(self, kept):
        stale = dict(self._step_masks)
        real(self, kept)
        self._step_masks.update(stale)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Constraint, "settle", broken)
        yield


@pytest.mark.parametrize("broken", [mask_after_the_filters, mask_on_the_draft_only, no_rollback,
                                    masks_kept_into_the_next_step])
def test_a_broken_grammar_engine_fails_the_law(pair, grammar, broken) -> None:
    target, draft = pair
    drafter, policy = drafters(draft)["model K=4"]
    generator = Generator(target, drafter, SETTINGS, policy, seed=11)
    with broken():
        p = min(law_p_value(generator, target.tokenizer.tokenize(text), grammar, target) for text in PROMPTS)
    assert p < 1e-6, f"{broken.__name__}: p = {p:.2e}"


def test_a_steps_mask_is_computed_once_for_each_position(pair, grammar) -> None:
    """The draft model's row and the target's row at one place in a step's draft share llguidance's mask
    (most of what a row under a grammar costs the host): no state's mask is computed twice in a step."""
    target, draft = pair
    computed, steps = [], [0]
    real_fill, real_settle = Constraint._fill, Constraint.settle

    def fill(self):
        computed.append((self, steps[0], tuple(self._path)))  # the constraint kept: its id is not reused
        return real_fill(self)

    def settle(self, kept):
        steps[0] += 1
        real_settle(self, kept)

    generator = Generator(target, Planner(model=ModelDrafter(draft)), SETTINGS, FixedK(4), seed=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Constraint, "_fill", fill)
        patch.setattr(Constraint, "settle", settle)
        for _ in range(20):
            list(generator.generate(target.tokenizer.tokenize("ab"), GenerationLimits(12, grammar=grammar)))
    keys = [(id(constraint), step, path) for constraint, step, path in computed]
    assert steps[0] > 20 and len(keys) == len(set(keys))
    assert any(len(path) >= 2 for _, _, path in computed)  # drafts of several tokens were read


# --- greedy ------------------------------------------------------------------------------------------

def law_greedy_reply(target, prompt: list[int], length: int) -> list[int]:
    """The law's greedy reply, written without the engine: each token the argmax of the law's row."""
    reply: tuple[int, ...] = ()
    while len(reply) < length:
        token = int(np.argmax(law_row(target, prompt, reply, SamplingParams(temperature=0))))
        if token == EOG:
            break
        reply += (token,)
    return list(reply)


def test_greedy_replies_under_the_grammar_are_the_target_alones(pair, grammar) -> None:
    """Every source's greedy reply equals the target alone's, and that is the law's (a broken argmax
    under the mask fails the second: `test_a_broken_greedy_argmax_fails_the_law`)."""
    target, draft = pair
    greedy = SamplingParams(temperature=0)
    for text in ["ab", "e", "cdab", "eeee", "abcdab"]:
        prompt = target.tokenizer.tokenize(text)
        replies = {}
        for name, (drafter, policy) in drafters(draft).items():
            generator = Generator(target, drafter, greedy, policy, seed=0)
            replies[name] = [event.token for event in generator.generate(prompt, GenerationLimits(24, grammar=grammar))
                             if isinstance(event, TokenEvent)]
        assert len(set(map(tuple, replies.values()))) == 1, (text, replies)
        assert replies["target alone"] == law_greedy_reply(target, prompt, 24), text


def test_a_broken_greedy_argmax_fails_the_law(pair, grammar) -> None:
    """The argmax over the allowed ids alone, taken as the last allowed id: the target alone's reply
    parts from the law's."""
    target, _ = pair

    def last_allowed(self, index):
        ids, values = self.read(index)
        return greedy_token(values) if ids is None else int(ids[-1])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ConstrainedRows, "greedy_token", last_allowed)
        parted = []
        for text in ["ab", "e", "cdab"]:
            prompt = target.tokenizer.tokenize(text)
            generator = Generator(target, None, SamplingParams(temperature=0))
            reply = [event.token for event in generator.generate(prompt, GenerationLimits(24, grammar=grammar))
                     if isinstance(event, TokenEvent)]
            parted.append(reply != law_greedy_reply(target, prompt, 24))
    assert any(parted)


# --- JSON --------------------------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"enum": ["ab", "cd"]},
        "words": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
    },
    "required": ["id", "tag", "words"],
    "additionalProperties": False,
}


def test_a_thousand_sampled_replies_under_a_schema_are_all_valid(pair) -> None:
    target, draft = pair
    schema = Grammar(GrammarSpec.json_schema(SCHEMA), target.tokenizer.grammar_vocabulary(), target.n_vocab)
    counts = {"valid": 0, "length": 0}
    for name, (drafter, policy) in drafters(draft).items():
        generator = Generator(target, drafter, SamplingParams(temperature=1.0), policy, seed=5)
        for _ in range(334):
            events = list(generator.generate(target.tokenizer.tokenize("json"), GenerationLimits(60, grammar=schema)))
            text = "".join(event.text for event in events if isinstance(event, TokenEvent)) + events[-1].trailing_text
            if events[-1].reason == "max_tokens":
                counts["length"] += 1  # cut short mid-structure: a client sees finish_reason "length"
                continue
            assert events[-1].reason == "eog", (name, events[-1].reason, text)
            jsonschema.validate(json.loads(text), SCHEMA)
            counts["valid"] += 1
    assert counts["valid"] >= 1000 - counts["length"] and counts["valid"] > 900, counts


# --- what is refused ----------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, says", [
    ({"type": "objekt"}, "at /type: Invalid type: objekt"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}},
     "at /properties/a/pattern: regex parse error: (?<=a)b error: look-around, including look-ahead and look-behind, is not supported"),
    ({"properties": {"b": {"not": {"type": "string"}}}}, 'at /properties/b/not: Unimplemented keys: ["not"]'),
    ({"$ref": "#/definitions/missing"}, "Pointer '/definitions/missing' does not exist"),
    ({"type": "integer", "minimum": 5, "maximum": 2}, "Unsatisfiable schema: minimum (5) is greater than maximum (2)"),
])
def test_a_schema_that_cannot_be_compiled_is_refused_naming_where_and_what(schema, says) -> None:
    with pytest.raises(GrammarError) as refused:
        check_grammar(GrammarSpec.json_schema(schema, "response_format"))
    assert str(refused.value) == f"response_format: {says}"


def test_the_boolean_schemas_are_any_json_and_nothing() -> None:
    assert GrammarSpec.json_schema(True) == GrammarSpec.json_schema({})  # true: any JSON (it had been refused)
    check_grammar(GrammarSpec.json_schema(True))
    with pytest.raises(GrammarError, match="no text satisfies it"):
        GrammarSpec.json_schema(False, "response_format")


def test_a_schema_nested_past_llguidances_depth_is_refused_not_a_crash() -> None:
    deep: dict = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    with pytest.raises(GrammarError, match="^response_format: recursion limit exceeded"):
        check_grammar(GrammarSpec.json_schema(deep, "response_format"))


@pytest.mark.parametrize("spec", [
    # llguidance compiles a schema that only refers to itself
    GrammarSpec.json_schema({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "response_format"),
    # every character of the stand-in's vocabulary but a tab, which no token spells
    GrammarSpec("grammar", 'start: "a" /\\t+/', "response_format"),
], ids=["a schema that refers to itself", "a tab the vocabulary cannot spell"])
def test_a_grammar_no_reply_satisfies_is_refused_before_a_reply_not_a_hang(pair, spec) -> None:
    target, _ = pair
    with pytest.raises(GrammarError, match="^response_format: no text satisfies it"):
        Grammar(spec, target.tokenizer.grammar_vocabulary(), target.n_vocab)
