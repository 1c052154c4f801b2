"""Validating one models.toml table: typed getters whose errors name the file and the key path."""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from speccli.errors import SpeccliError
from speccli.drafting.registry import check_spec
from speccli.validation import AUTO_K, Endpoint, K, check_gpu_layers, check_k, parse_endpoints

_BARE_TOML_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TOML_TYPE_NAMES = {str: "a string", int: "an integer", bool: "a boolean", float: "a float", dict: "a table", list: "an array"}


def key_path(*parts: str) -> str:
    return ".".join(part if _BARE_TOML_KEY.fullmatch(part) else f'"{part}"' for part in parts)


def one_of(names: Iterable[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)


def type_name(value: object) -> str:
    if isinstance(value, str) and not value:
        return "an empty string"
    return _TOML_TYPE_NAMES.get(type(value), type(value).__name__)


class TomlTable:
    """One TOML table being validated; errors name the file and the key path."""

    def __init__(self, file: Path, path: tuple[str, ...], value: object) -> None:
        self.file = file
        self.key_path = path
        if not isinstance(value, dict):
            raise self.error(f"expected a table, got {type_name(value)}")
        self.values: dict[str, object] = value

    def error(self, problem: str, *key: str) -> SpeccliError:
        return SpeccliError(f"{self.file}: {key_path(*self.key_path, *key)}: {problem}")

    def only(self, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for key in self.values:
            if key not in allowed:
                problem = f"unknown key; expected {one_of(allowed)}"
                if len(self.key_path) >= 2 and isinstance(self.values[key], dict):
                    # [models.qwen2.5-x] is model "qwen2" with a table "5-x" to TOML: its name wanted quotes.
                    dotted = ".".join((*self.key_path[1:], key))
                    problem += f"; a name with a dot must be quoted: [{self.key_path[0]}.\"{dotted}\"]"
                raise self.error(problem, key)

    def table(self, key: str) -> TomlTable:
        return TomlTable(self.file, (*self.key_path, key), self.values[key])

    def string(self, key: str, *, required: bool = True) -> str | None:
        if key not in self.values:
            if required:
                raise self.error("missing", key)
            return None
        value = self.values[key]
        if not isinstance(value, str) or not value:
            raise self.error(f"expected a non-empty string, got {type_name(value)}", key)
        return value

    def boolean(self, key: str, *, default: bool) -> bool:
        value = self.values.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"expected true or false, got {type_name(value)}", key)
        return value

    def integer(self, key: str, *, default: int | None, minimum: int) -> int | None:
        if key not in self.values and default is None:
            return None
        value = self.values.get(key, default)
        if type(value) is not int:  # bool is an int subclass: reject it too
            raise self.error(f"expected an integer, got {type_name(value)}", key)
        if value < minimum:
            raise self.error(f"must be at least {minimum}, got {value}", key)
        return value

    def k(self, key: str) -> K:
        """Draft tokens per step: 'auto' (the default) or a whole number, by the one rule in speccli.validation."""
        value = self.values.get(key, AUTO_K)
        if value == AUTO_K:
            return AUTO_K
        if isinstance(value, str):  # a K quoted, or 'auto' misspelt: say which was written
            hint = f"; write k = {value.strip()} without quotes" if value.strip().isdigit() else ""
            raise self.error(f"expected 'auto' or an integer, got the string {value!r}{hint}", key)
        if type(value) is not int:  # bool is an int subclass: reject it too
            raise self.error(f"expected 'auto' or an integer, got {type_name(value)}", key)
        return check_k(value, f"{self.file}: {key_path(*self.key_path, key)}")

    def gpu_layers(self, key: str, *, default: int) -> int:
        """Layers to offload: a count or -1 for all, by the one rule in speccli.validation (as --ngl)."""
        value = self.values.get(key, default)
        if type(value) is not int:  # bool is an int subclass: reject it too
            raise self.error(f"expected an integer, got {type_name(value)}", key)
        return check_gpu_layers(value, f"{self.file}: {key_path(*self.key_path, key)}")

    def endpoints(self, key: str) -> tuple[Endpoint, ...]:
        """RPC servers, "host:port,host:port" (as --rpc); none where the key is absent."""
        value = self.string(key, required=False)
        try:
            return parse_endpoints(value, f"{self.file}: {key_path(*self.key_path, key)}") if value else ()
        except SpeccliError as error:  # a file that reads: a value in it is refused (exit 1), whatever its shape
            raise SpeccliError(str(error)) from None

    def spec(self, key: str, *, default: str) -> str:
        value = self.string(key, required=False) or default
        return check_spec(value, f"{self.file}: {key_path(*self.key_path, key)}")

    def sha256(self, key: str, *, required: bool) -> str | None:
        value = self.string(key, required=required)
        if value is None:
            return None
        if not _SHA256.fullmatch(value.lower()):
            raise self.error("expected 64 hexadecimal digits", key)
        return value.lower()
