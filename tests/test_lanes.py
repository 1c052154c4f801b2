"""The lanes' lists in tests/conftest.py name tests that exist (a renamed test would leave the fast lane
running a slow one)."""
from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SLOW_TESTS

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_listed_as_slow_exists() -> None:
    for node_id in SLOW_TESTS:
        path, name = re.fullmatch(r"([\w/]+\.py)::(\w+)(\[.*\])?", node_id).group(1, 2)
        assert f"\ndef {name}(" in (ROOT / path).read_text(), f"{node_id}: no such test"
