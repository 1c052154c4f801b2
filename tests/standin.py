"""A numpy stand-in for `speccli.llama.model.Model`: the generator and the drafters without llama.cpp.

The next token's logits are a fixed function of the last two tokens: row `state(context)` of a seeded
random table (`logit_table`). So the target's exact next-token distribution after any context is one
table row, known without decoding anything, and a draft made from the same table plus noise
(`related_draft`) proposes tokens the target often, but not always, keeps.

Its KV "cache" is the list of tokens it holds (`held`), and its logits come from that list: a cache
left holding a wrong token after a rollback gives wrong logits, as a real one would, and a test can
compare `held` with what the generator thinks it holds. Like llama.cpp's, each decode returns a view of
one buffer that the next decode overwrites, refuses what Model.decode refuses (no tokens, more logit
rows than tokens or than n_batch, a full context) and ids past its vocabulary, and it counts what it
decodes (`decoded_tokens`, and each decode's size in `decode_sizes`). `time_decode` returns a
pretended cost (`cost`), so no timing noise reaches a K policy calibrated on it.

The vocabulary (`StandInTokenizer`): id 0 is the end of generation (no text); every other id is one
printable ASCII character, so a test can write prompts and stop strings as text.
"""
from __future__ import annotations

import string
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from speccli.core.sampling import SamplingParams, probabilities
from speccli.llama.model import check_decode

EOG = 0
STATE_BASE = 64  # state = previous token * STATE_BASE + last token, modulo the table's rows
CHARACTERS = string.ascii_lowercase + " " + string.ascii_uppercase + ".,!?" + string.digits + '{}":[]-'


def pretended_cost(n_tokens: int, n_logit_rows: int) -> float:
    """Seconds of one decode as a GPU would have it: nearly flat in its size."""
    return 1e-3 * (1 + 0.02 * n_tokens)


class StandInTokenizer:
    """One character a token; id 0 ends generation (`EOG`). Ids past len(CHARACTERS) repeat them."""

    bos_id = -1
    eos_id = EOG
    adds_bos = False
    chat_template = None

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == EOG else CHARACTERS[(token - 1) % len(CHARACTERS)].encode()

    def token_text(self, token: int) -> str:
        return "</s>" if token == EOG else self.token_bytes(token).decode()

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return b"".join(self.token_bytes(token) for token in tokens)

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        text = text.decode() if isinstance(text, bytes) else text
        return [CHARACTERS.index(character) + 1 for character in text]

    def is_end_of_generation(self, token: int) -> bool:
        return token == EOG

    def grammar_vocabulary(self):
        """The vocabulary as llguidance reads it (as speccli.llama.tokenizer's does for a real model):
        one character a token, so a grammar's text has one tokenization."""
        import llguidance

        tokenizer = self

        class Characters:
            eos_token_id, bos_token_id, special_token_ids = EOG, None, [EOG]
            tokens = [b"\xff</s>"] + [tokenizer.token_bytes(token) for token in range(1, tokenizer.n_vocab)]

            def __call__(self, text):
                return tokenizer.tokenize(text)

        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Characters()))


def logit_table(n_vocab: int = 64, seed: int = 0, scale: float = 3.0, eog_bias: float = -3.0,
                n_states: int | None = None) -> np.ndarray:
    """(n_states, n_vocab) float32 logits, normal with standard deviation `scale`; `eog_bias` is added
    to the end-of-generation column (-inf: a reply never ends by itself). 4096 states by default: one
    per pair of tokens of a 64-token vocabulary (a larger one shares rows)."""
    n_states = n_states or STATE_BASE * STATE_BASE
    table = np.random.default_rng(seed).normal(0.0, scale, size=(n_states, n_vocab)).astype(np.float32)
    table[:, EOG] += np.float32(eog_bias)
    return table


class StandInModel:
    """Model's interface as core/ and drafting/ use it, over a logit table (see the module docstring)."""

    companion_rows = 0  # never beside other sequences

    def __init__(self, table: np.ndarray, n_ctx: int = 256, n_batch: int = 64, name: str = "stand-in",
                 cost: Callable[[int, int], float] = pretended_cost) -> None:
        self.table = table
        self.n_vocab = table.shape[1]
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.path = Path(f"{name}.gguf")  # what error messages name a model by
        self.tokenizer = StandInTokenizer(self.n_vocab)
        self.cost = cost
        self.held: list[int] = []  # the KV cache: the tokens it holds, at positions 0 .. n_past-1
        self.decoded_tokens = 0
        self.decode_sizes: list[tuple[int, int]] = []  # (tokens, logit rows) of each decode
        self._buffer = np.empty((n_batch, self.n_vocab), dtype=np.float32)
        self._last_logits: np.ndarray | None = None

    @property
    def n_past(self) -> int:
        return len(self.held)

    def state(self, context: Sequence[int]) -> int:
        """The table row after `context`: its last two tokens (a one-token context follows EOG)."""
        previous = context[-2] if len(context) > 1 else EOG
        return (previous * STATE_BASE + context[-1]) % len(self.table)

    def next_logits(self, context: Sequence[int]) -> np.ndarray:
        """The logits after `context`, straight from the table: what a decode ending there returns."""
        return self.table[self.state(context)]

    def next_probabilities(self, context: Sequence[int], sampling: SamplingParams) -> np.ndarray:
        return probabilities(self.next_logits(context)[None], sampling)[0]

    def decode(self, tokens: Sequence[int], n_logit_rows: int = 1) -> np.ndarray:
        self._last_logits = None
        check_decode(tokens, n_logit_rows, self.n_past, self.n_ctx, self.n_batch)
        if not all(0 <= token < self.n_vocab for token in tokens):
            raise ValueError(f"{self.path}: a token id outside its vocabulary of {self.n_vocab}: {list(tokens)}")
        self.held.extend(int(token) for token in tokens)
        self.decoded_tokens += len(tokens)
        self.decode_sizes.append((len(tokens), n_logit_rows))
        rows = self._buffer[:n_logit_rows]  # overwritten by the next decode, as llama.cpp's buffer is
        for i in range(n_logit_rows):
            rows[i] = self.next_logits(self.held[: self.n_past - n_logit_rows + 1 + i])
        self._last_logits = rows
        return rows

    def truncate(self, n_tokens: int) -> None:
        del self.held[n_tokens:]

    def reset(self) -> None:
        self.held.clear()

    def time_decode(self, tokens: Sequence[int], n_logit_rows: int) -> float:
        start = self.n_past
        self.decode(tokens, n_logit_rows)
        self.truncate(start)
        return self.cost(len(tokens), n_logit_rows)

    def gave_non_finite_logits(self) -> bool:
        rows = self._last_logits
        if rows is None or not rows.size:
            return False
        return bool((np.isnan(rows) | np.isposinf(rows)).any() or not np.isfinite(rows).any(axis=1).all())

    def close(self) -> None:
        pass

    def __enter__(self) -> StandInModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def stand_in(n_vocab: int = 64, seed: int = 0, scale: float = 3.0, eog_bias: float = -3.0,
             n_ctx: int = 256, n_batch: int = 64, n_states: int | None = None) -> StandInModel:
    """A target."""
    return StandInModel(logit_table(n_vocab, seed, scale, eog_bias, n_states), n_ctx, n_batch, "target")


def related_draft(target: StandInModel, noise: float = 1.0, seed: int = 1, n_vocab: int | None = None) -> StandInModel:
    """A draft for `target`: its table plus normal noise of standard deviation `noise` (0: the target
    itself), optionally cut to a smaller vocabulary (the target's extra ids are then padding)."""
    table = target.table + np.random.default_rng(seed).normal(0.0, noise, size=target.table.shape).astype(np.float32)
    return StandInModel(table[:, :n_vocab], target.n_ctx, target.n_batch, "draft", target.cost)


def stand_in_pair(noise: float = 1.0, **target_settings) -> tuple[StandInModel, StandInModel]:
    target = stand_in(**target_settings)
    return target, related_draft(target, noise)


def exact_two_token_distribution(target: StandInModel, prompt: Sequence[int],
                                 sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first two generated tokens) under the target alone, from its table (nothing decoded); a reply
    that ends at its first token is one token long."""
    first = target.next_probabilities(prompt, sampling)
    joint = {}
    for token in np.flatnonzero(first > 0).tolist():
        if token == EOG:
            joint[(token,)] = float(first[token])
            continue
        second = target.next_probabilities([*prompt, token], sampling)
        for following in np.flatnonzero(second > 0).tolist():
            joint[(token, following)] = float(first[token] * second[following])
    return joint
