"""A grammar's hold on a reply: which tokens may come next, which it forces, and the law it samples by.

The law (docs/exactness.md#structured-output). With a grammar, the target's distribution at each
position is its logits restricted to the tokens the grammar allows after the reply so far (the end of
generation only where the grammar may end), then the temperature, top-k, top-p and min-p, renormalized:

    p_G(x | s) = filters(logits(s) + log 1[x allowed after s])

llama.cpp's `grammar_first` order, and llama-cpp-python's example server's. Masking first is what
makes the filters choose among legal tokens: masking after them (llama.cpp's default, "sample, then
check") keeps a top-k of 40 that may hold one legal token where the grammar allows hundreds.

Speculation under it stays exact because every row, the target's and the draft's, is read through the
same mask (`ConstrainedRows`, `Constraint.read`) with the grammar's state advanced along the draft to
that row, and the state is rolled back to the kept prefix after the verdict. A lookup's tokens are cut
at the first the grammar forbids (p_G is 0 there: verification would reject it anyway), and the tokens
the grammar forces are proposed with certainty: accepted with p_G(x), which is 1 where no other
tokenization is legal.

llguidance (the engine of llama.cpp's `--grammar` option `llguidance` and of vLLM's structured output)
keeps the state and computes each mask (its cost per row: docs/results.md#structured-output).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from speccli.core.sampling import Distribution, SamplingParams, distribution_among, greedy_token
from speccli.errors import SpeccliError

# JSON's whitespace as llama.cpp's schema grammars allow it (its SPACE_RULE): between any two tokens,
# nothing, a space, or one or two newlines and an indent of up to 20, so a schema means the same language
# in both and the model lays JSON out as it would (compact, one line, or indented). Bounded: llguidance's
# default allows any amount, which a small model can pad forever in.
JSON_LAYOUT = {"whitespace_flexible": True, "whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})?"}


class GrammarError(SpeccliError):
    """A schema or grammar that cannot be compiled, or a reply the grammar leaves no token for."""

    exit_code = 2


@dataclass(frozen=True)
class GrammarSpec:
    """What a user asked for: a JSON schema (`json_schema`), any JSON object (`json_object`), or a
    grammar in Lark or GBNF syntax (`grammar`). `text` is the schema as JSON, or the grammar."""

    kind: str
    text: str
    name: str = "the grammar"  # how a message names it: a file, "response_format.json_schema.schema"

    @staticmethod
    def json_schema(schema: Any, name: str = "the JSON schema") -> GrammarSpec:
        """A JSON schema: an object, or `true` (any JSON: taken as {}); `false` (no JSON) is refused."""
        if schema is False:
            raise GrammarError(f"{name}: no text satisfies it (false, the schema nothing satisfies)")
        if not isinstance(schema, dict) and schema is not True:
            raise GrammarError(f"{name}: a JSON schema must be an object or a boolean, got {type(schema).__name__}")
        return GrammarSpec("json_schema", json.dumps({} if schema is True else schema), name)

    @staticmethod
    def json_object() -> GrammarSpec:
        return GrammarSpec("json_schema", json.dumps({"type": "object"}), "json_object")

    def definition(self) -> str:
        """The grammar as llguidance takes it (checked for errors by `check_grammar`)."""
        import llguidance

        try:
            if self.kind == "json_schema":
                # A schema's own layout (its "x-guidance" settings, llguidance's) replaces this one whole.
                own = "x-guidance" in json.loads(self.text)
                return llguidance.LLMatcher.grammar_from_json_schema(self.text, defaults=None if own else JSON_LAYOUT)
            return llguidance.grammar_from("grammar", self.text)  # Lark, or GBNF converted to Lark
        except ValueError as error:  # e.g. a schema nested deeper than llguidance goes
            raise GrammarError(f"{self.name}: {_one_line(str(error))}") from None


def check_grammar(spec: GrammarSpec, vocabulary: Any = None) -> str:
    """The spec's llguidance definition, or GrammarError naming what is wrong: first without a vocabulary
    (a server refuses a bad schema before it reads one), then with it (what is too big for llguidance's
    limits only shows there: a 100,000-value enum is refused in 0.6 s)."""
    import llguidance

    definition = spec.definition()
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(definition, vocabulary)
    if failed:
        message = _one_line(messages[0])
        where = _where(json.loads(spec.text), message) if spec.kind == "json_schema" else None
        raise GrammarError(f"{spec.name}: {f'at {where}: ' if where else ''}{message}")
    return definition


class Grammar:
    """A checked grammar for one vocabulary (llguidance's tokenizer of it, `grammar_vocabulary()`):
    `start()` gives the state at a reply's start."""

    def __init__(self, spec: GrammarSpec, vocabulary: Any, n_vocab: int) -> None:
        self.spec, self.definition = spec, check_grammar(spec, vocabulary)
        self._vocabulary, self.n_vocab = vocabulary, n_vocab
        self._positions = MaskPositions()  # shared by its replies: their masks repeat
        if not self.start().allowed().any():  # e.g. a schema that only refers to itself (llguidance takes it)
            raise GrammarError(f"{spec.name}: no text satisfies it (nothing may begin a reply)")

    def start(self) -> Constraint:
        import llguidance

        matcher = llguidance.LLMatcher(self._vocabulary, self.definition, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"{self.spec.name}: {_one_line(matcher.get_error())}")
        return Constraint(matcher, self.n_vocab, self._vocabulary.eos_tokens, self._positions)


class Constraint:
    """The grammar's state along one reply: pushed a token at a time as tokens are drafted or kept,
    popped back after a rejection.

    Within a step a position's mask is computed once: the draft model's row and the target's row at the
    same place in the draft are read at the same state (the tokens pushed since the step began), and
    llguidance's mask is most of a row's cost. `settle` forgets them: a mask kept into the next step
    would be another state's (vLLM's stale-mask bug under speculation)."""

    def __init__(self, matcher: Any, n_vocab: int, ends: Sequence[int], positions: MaskPositions) -> None:
        self._matcher, self.n_vocab, self._positions = matcher, n_vocab, positions
        ends = np.array([token for token in ends if token < n_vocab], dtype=np.int64)  # end-of-generation ids
        # Where their bits sit in the mask's words: computed once, not at every row.
        self._end_words, self._end_bits = ends >> 5, np.left_shift(np.uint32(1), (ends & 31).astype(np.uint32))
        self._bits = np.zeros((1, (n_vocab + 31) // 32), dtype=np.int32)  # llguidance's mask: bit t of word t // 32
        self._words = self._bits[0].view(np.uint32)
        self._path: list[int] = []  # the tokens pushed since the last `settle`
        self._step_masks: dict[tuple[int, ...], tuple[bool, np.ndarray]] = {}  # by path: `MaskPositions.of`'s

    @property
    def depth(self) -> int:
        """Tokens pushed since the last `settle`."""
        return len(self._path)

    def _fill(self) -> np.ndarray:
        """The mask of what may come next, as words of 32 tokens."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._matcher, self._bits)
        words = self._words
        if (words[self._end_words] & self._end_bits).any() and not self._matcher.is_accepting():
            # llguidance's way out of a dead end is to allow the end of generation: here that would end an
            # unfinished text as if complete, so the end is taken out again (and `masked` says so).
            np.bitwise_and.at(words, self._end_words, ~self._end_bits)
        return words

    def allowed(self) -> np.ndarray:
        """Which tokens may come next: a bool row of the vocabulary."""
        return np.unpackbits(self._fill().view(np.uint8), count=self.n_vocab, bitorder="little").view(bool)

    def read(self, logits: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """A row read through the mask: (ids, their logits) where few tokens are allowed next (JSON's
        structure), so that the rest of the row, cold after a decode, is neither written nor scanned; else
        (None, the row) with the few tokens the grammar forbids set to -inf in `logits` itself (inside a
        string: a decode's row, read by nothing else, saves copying it). A draft's row may be wider or
        narrower than the grammar's vocabulary: ids past it are forbidden. Which ids are allowed or
        forbidden is kept by the mask's bits (`MaskPositions`): masks repeat (every string's inside,
        every key), and finding the ids of a scattered mask costs more than the rest of a row's work."""
        few, ids = self._mask(len(logits))
        if few:
            return ids, logits[ids]
        logits[min(len(logits), self.n_vocab):] = -np.inf
        logits[ids] = -np.inf
        return None, logits

    def _mask(self, width: int) -> tuple[bool, np.ndarray]:
        """Whether few tokens are allowed next, and which (else which are forbidden), ids below `width`."""
        path = tuple(self._path)
        found = self._step_masks.get(path)
        if found is None:
            found = self._step_masks[path] = self._positions.of(self._fill(), self.n_vocab)
        few, ids = found
        if few and not len(ids):
            raise GrammarError(self.dead_end())
        return few, ids[ids < width] if width < self.n_vocab else ids

    def dead_end(self) -> str:
        error = self._matcher.get_error().strip().split("\n")[0]  # its first line: the rest is its parser's state
        return f"the grammar allows no token here{f' ({error})' if error else ''}"

    def forced(self, limit: int) -> list[int]:
        """The tokens the grammar forces next (its canonical tokenization of the forced text), at most `limit`,
        as far as the grammar takes them: forced text that spells a special token (`</tool_call>` inside a
        string) tokenizes to that token, which the grammar does not take as text."""
        if limit <= 0 or self._matcher.is_stopped():
            return []
        forced = self._matcher.compute_ff_tokens()[:limit]
        return forced[: self.legal_prefix(forced)]

    def legal_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order, the grammar allows from here."""
        return self._matcher.validate_tokens(list(tokens)) if tokens else 0

    def accepts(self, tokens: Sequence[int]) -> bool:
        """Whether the grammar takes all of `tokens` from here and may end after them."""
        if self.legal_prefix(tokens) < len(tokens):
            return False
        self.push(tokens)
        return self._matcher.is_accepting()

    @property
    def stopped(self) -> bool:
        """The grammar is complete and takes nothing more (the end of generation included)."""
        return self._matcher.is_stopped()

    def push(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if self._matcher.is_stopped():
                break  # nothing but the end of generation may follow, and the reply ends with it
            if not self._matcher.consume_token(token):
                raise GrammarError(self.dead_end())
            self._path.append(token)

    def pop(self, count: int) -> None:
        if count:
            self._matcher.rollback(count)
            del self._path[-count:]

    def settle(self, kept: Sequence[int]) -> None:
        """The step's verdict: back to where the step began, then forward by what it kept."""
        self.pop(self.depth)
        self.push(kept)
        self._path.clear()
        self._step_masks.clear()


class ConstrainedRows:
    """The target's rows of one step read through the grammar: row i masked at the state after the
    draft's first i tokens. Rows are read in order and verification stops at the first rejection, so
    the state advances with the reading and no mask is computed for a row never read."""

    def __init__(self, logits: np.ndarray, constraint: Constraint, drafted: Sequence[int]) -> None:
        self._logits, self._constraint, self._drafted = logits, constraint, drafted
        self._row = -1

    def read(self, index: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Row `index` through the mask (`Constraint.read`)."""
        self._advance(index)
        return self._constraint.read(self._logits[index])

    def greedy_token(self, index: int) -> int:
        ids, values = self.read(index)
        return greedy_token(values, ids)

    def distribution(self, index: int, params: SamplingParams, out: np.ndarray | None = None) -> Distribution:
        return distribution_among(*self.read(index), params, self._logits.shape[1], out)

    def _advance(self, index: int) -> None:
        if not 0 <= index < len(self._logits):
            raise IndexError(index)
        if index < self._row:
            raise ValueError("rows under a grammar are read in order")
        constraint = self._constraint
        constraint.push(self._drafted[constraint.depth : index])
        self._row = index


class MaskPositions:
    """The ids a mask allows where it allows few, else those it forbids, by the mask's bits: the last
    MASKS_KEPT masks seen."""

    MASKS_KEPT = 256  # at most a few MB: a JSON schema's replies show some dozens

    def __init__(self) -> None:
        self._kept: dict[bytes, tuple[bool, np.ndarray]] = {}

    def of(self, words: np.ndarray, n_vocab: int) -> tuple[bool, np.ndarray]:
        key = words.tobytes()
        found = self._kept.get(key)
        if found is None:
            allowed = np.unpackbits(words.view(np.uint8), count=n_vocab, bitorder="little")
            few = int(allowed.sum(dtype=np.int64)) * 2 <= n_vocab
            found = (few, _set_bits(words) if few else np.flatnonzero(allowed == 0))
            if len(self._kept) >= self.MASKS_KEPT:
                del self._kept[next(iter(self._kept))]
            self._kept[key] = found
        return found


def _set_bits(words: np.ndarray) -> np.ndarray:
    """The positions of the set bits of uint32 words (bit j of word i: position 32 i + j), ascending."""
    nonzero = np.flatnonzero(words)
    bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little").reshape(-1, 32)
    rows, columns = np.nonzero(bits)
    return nonzero[rows] * 32 + columns


def _one_line(message: str) -> str:
    """llguidance's message on one line, without the lines that only point at a column."""
    lines = [line.strip() for line in message.strip().splitlines() if set(line.strip()) - set("^ ")]
    return " ".join(lines)[:400] or "invalid"


def _where(schema: Any, message: str, pointer: str = "") -> str | None:
    """The first place in a schema (a JSON pointer) whose key the message quotes or whose text it
    repeats: llguidance names the problem, not where it is."""
    items = schema.items() if isinstance(schema, dict) else enumerate(schema) if isinstance(schema, list) else ()
    for key, value in items:
        here = f"{pointer}/{key}"
        if isinstance(key, str) and f'"{key}"' in message or isinstance(value, str) and len(value) > 1 and value in message:
            return here
        found = _where(value, message, here)
        if found:
            return found
    return None
