"""Every code the server can answer is in the protocol's error catalogue (``protocol/errors.py``).

A ``DomainError`` or ``ProtocolError`` raised with an uncatalogued code would answer 500; this
walks the source of every server and protocol package and collects each literal code passed to
them, so a new code cannot ship without its catalogue entry (status, meaning, worker action).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.errors import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [
    "protocol",
    "core",
    "audit",
    "workers",
    "runs",
    "placement",
    "leases",
    "actions",
    "api",
    "console",
]
RAISERS = {"DomainError", "ProtocolError"}


def raised_codes() -> dict[str, str]:
    """code → "file:line" of one place that raises it, for every literal code in the tree."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                first = node.args[0]
                if name in RAISERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.setdefault(first.value, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_walk_finds_the_codes_it_is_meant_to_find():
    codes = raised_codes()
    # A few codes raised in different layers: the walk must reach each of them.
    assert {"session_superseded", "lease_token_mismatch", "json_duplicate_key", "principal_mismatch"} <= set(
        codes
    )


@pytest.mark.parametrize("code,where", sorted(raised_codes().items()))
def test_every_raised_code_is_catalogued(code, where):
    assert code in CATALOGUE, f"{where} raises {code!r}, which protocol/errors.py does not catalogue"
