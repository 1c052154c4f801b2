"""The token sequences a fidelity check teacher-forces: a built-in mix of text, code and chat, or the user's.

Every sequence is tokenized with the reference's tokenizer (BOS added as the model expects); the
candidates read the same ids (their vocabularies were checked to agree first).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from speccli.errors import SpeccliError, UnreadableFileError, unreadable_reason
from speccli.util.files import read_text_input

# Three kinds of input where a broken quant shows differently: prose (broad distributions), code
# (sharp, syntax-driven ones) and a chat turn (instruction-following framing).
BUILTIN_TEXTS: dict[str, str] = {
    "prose": (
        "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps as his "
        "father had taught him. There were one hundred and twelve of them, worn smooth in the middle by a "
        "century of boots. At the top he trimmed the wick, polished the great lens with a soft cloth, and "
        "watched the fishing boats come home across the darkening bay. Some nights the fog rolled in so "
        "thick that he could not see the rocks below, and then he would sound the horn every thirty seconds "
        "until morning, drinking cold tea and listening to the waves. He kept a log of every ship that "
        "passed, its name, its flag and the hour, in a neat hand that grew shakier with the years."
    ),
    "code": (
        "import json\nfrom pathlib import Path\n\n\ndef load_settings(path: Path) -> dict:\n"
        "    \"\"\"Read a JSON settings file, falling back to defaults for missing keys.\"\"\"\n"
        "    defaults = {\"timeout\": 30, \"retries\": 3, \"verbose\": False}\n"
        "    if not path.exists():\n        return dict(defaults)\n"
        "    with path.open(encoding=\"utf-8\") as handle:\n        loaded = json.load(handle)\n"
        "    return {**defaults, **loaded}\n\n\ndef fibonacci(n: int) -> list[int]:\n"
        "    numbers = [0, 1]\n    while len(numbers) < n:\n        numbers.append(numbers[-1] + numbers[-2])\n"
        "    return numbers[:n]\n\n\nif __name__ == \"__main__\":\n"
        "    settings = load_settings(Path(\"settings.json\"))\n    for value in fibonacci(settings[\"retries\"] * 4):\n"
        "        print(f\"{value:>6}\")\n"
    ),
    "chat": (
        "User: I have a job interview tomorrow for a junior accountant position. What should I prepare?\n"
        "Assistant: Congratulations on the interview! Here is a short plan for tonight:\n"
        "1. Review the job description and match each requirement to an example from your experience.\n"
        "2. Refresh the basics: debits and credits, the three financial statements, and how they connect.\n"
        "3. Prepare two or three questions for them, such as how the team closes the books each month.\n"
        "4. Pick your clothes, print your CV, and plan to arrive ten minutes early.\n"
        "User: What if they ask about a weakness?\n"
        "Assistant: Choose a real but manageable one, and show what you are doing about it. For example, "
        "you might say that you used to spend too long double-checking small entries, and that you now use "
        "a checklist so you can move faster without losing accuracy."
    ),
}


@dataclass(frozen=True)
class TextSource:
    """Named texts to teacher-force, each one sequence (split further if longer than the context allows)."""

    texts: dict[str, str]
    description: str


def builtin_source() -> TextSource:
    return TextSource(dict(BUILTIN_TEXTS), "built-in mix of prose, code and chat")


def text_file_source(path: Path) -> TextSource:
    """A plain text file (--text), as one sequence."""
    text = _read(path, "--text")
    if not text.strip():
        raise SpeccliError(f"--text {path}: the text file is empty")
    return TextSource({path.name: text}, f"text file {path}")


def prompts_file_source(path: Path) -> TextSource:
    """A prompts file (--prompts): JSON lines with a "prompt" (or "text") field, like bench's, or one prompt
    per line."""
    texts: dict[str, str] = {}
    for number, line in enumerate(_read(path, "--prompts").splitlines(), start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise SpeccliError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            text = record.get("prompt") or record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise SpeccliError(f"{path}:{number}: a JSON line needs a non-empty \"prompt\" or \"text\" string")
            name = str(record.get("id") or f"line {number}")
        else:
            text, name = line, f"line {number}"
        texts[name if name not in texts else f"{name} (line {number})"] = text
    if not texts:
        raise SpeccliError(f"--prompts {path}: the prompts file has no prompts")
    return TextSource(texts, f"prompts file {path}")


def _read(path: Path, option: str) -> str:
    try:
        return read_text_input(path, f"{option} {path}").decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableFileError(f"{option} {path}: not UTF-8 text") from None
    except OSError as error:
        raise UnreadableFileError(f"{option} {path}: {unreadable_reason(path, error, 'text file')}") from None


def tokenize_source(source: TextSource, tokenizer, max_length: int) -> list[tuple[str, list[int]]]:
    """(name, token ids) per sequence; a text longer than `max_length` tokens becomes several sequences,
    each starting afresh (with BOS) so no sequence outgrows the context window."""
    sequences: list[tuple[str, list[int]]] = []
    for name, text in source.texts.items():
        tokens = tokenizer.tokenize(text, add_special=True)
        prefix = tokens[:1] if tokenizer.adds_bos and tokens[:1] == [tokenizer.bos_id] else []
        body = tokens[len(prefix):]
        step = max_length - len(prefix)
        for part, start in enumerate(range(0, max(len(body), 1), step)):
            piece = prefix + body[start : start + step]
            if len(piece) >= 2:
                sequences.append((name if start == 0 else f"{name} #{part + 1}", piece))
    if not sequences:
        raise SpeccliError(f"{source.description}: no text to compare (every sequence is shorter than 2 tokens)")
    return sequences
