"""Bench prompts: the built-in set (one prompt per task kind) and user files (JSONL or plain text)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from speccli.errors import SpeccliError, UnreadableFileError
from speccli.util.files import read_text_input

BUILTIN_PROMPTS = "bench_prompts.jsonl"
STRUCTURED_PROMPTS = "bench_structured.jsonl"  # under --json-schema or --grammar: documents to extract from


@dataclass(frozen=True)
class BenchPrompt:
    task: str
    prompt: str


@dataclass(frozen=True)
class PromptSet:
    source: str  # "built-in" or the file as given
    prompts: tuple[BenchPrompt, ...]

    @property
    def sha256(self) -> str:
        canonical = json.dumps([[p.task, p.prompt] for p in self.prompts], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(p.task for p in self.prompts))


def load_prompt_set(path: Path | None, structured: bool = False) -> PromptSet:
    """The built-in set (`structured`: its extraction set), or a file: JSONL of {"task": ..., "prompt": ...}
    (task optional; a file named .jsonl, or whose first line is an object), or plain UTF-8 text with one
    prompt per line (task "text"; write a newline inside a prompt as \\n)."""
    if path is None:
        name = STRUCTURED_PROMPTS if structured else BUILTIN_PROMPTS
        data = resources.files("speccli.data").joinpath(name).read_bytes()
        return PromptSet("built-in structured" if structured else "built-in", _parse_prompts(data, name))
    if not path.exists():
        raise UnreadableFileError(f"prompts file {path}: no such file")
    if path.is_dir():
        raise UnreadableFileError(f"prompts file {path}: is a directory")
    try:
        data = read_text_input(path, f"prompts file {path}")
    except OSError as error:
        raise UnreadableFileError(f"prompts file {path}: cannot read it ({error.strerror})") from None
    return PromptSet(str(path), _parse_prompts(data, str(path)))


def _parse_prompts(data: bytes, name: str) -> tuple[BenchPrompt, ...]:
    if b"\x00" in data:
        raise UnreadableFileError(f"prompts file {name}: binary data, not JSONL or text (one prompt per line)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UnreadableFileError(
            f"prompts file {name}: not UTF-8 text (bad byte at offset {error.start}); expected JSONL or one prompt per line"
        ) from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise SpeccliError(f"prompts file {name}: no prompts in it (empty or only blank lines)")
    if lines[0][1].lstrip().startswith("{") or name.lower().endswith(".jsonl"):
        return tuple(_jsonl_prompt(line, number, name) for number, line in lines)
    return tuple(BenchPrompt("text", line.replace("\\n", "\n")) for _, line in lines)


def _jsonl_prompt(line: str, number: int, name: str) -> BenchPrompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise UnreadableFileError(f"prompts file {name}, line {number}: not valid JSON ({error.msg}); the file reads as JSONL") from None
    if not isinstance(record, dict):
        raise SpeccliError(f"prompts file {name}, line {number}: expected an object {{\"task\": ..., \"prompt\": ...}}")
    prompt, task = record.get("prompt"), record.get("task", "prompt")
    if "prompt" not in record:  # {"text": 5} had been told "prompt" must be a string: name what was given
        given = ", ".join(repr(key) for key in record) or "none"
        raise SpeccliError(f"prompts file {name}, line {number}: no \"prompt\" key (keys given: {given}); a line is "
                           "{\"task\": ..., \"prompt\": ...}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpeccliError(f"prompts file {name}, line {number}: \"prompt\" must be a string with text in it")
    if not isinstance(task, str) or not task:
        raise SpeccliError(f"prompts file {name}, line {number}: \"task\" must be a non-empty string")
    return BenchPrompt(task, prompt)
