"""Every code the server can answer is in the protocol's error catalogue (``protocol/errors.py``).

An uncatalogued code would answer 500 (``DomainError`` looks its status up) or an undocumented
body. This walks the source of every server and protocol package and collects each literal code
it can answer with: the first argument of ``DomainError``/``ProtocolError`` and of every helper
whose first parameter is ``code`` (both branches of a conditional included), ``"code": …`` in a
dict built by hand, and literals assigned to a variable named ``code``.
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


def _trees() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(encoding="utf-8")))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _code_literals(node: ast.AST) -> list[str]:
    """String literals a code-valued expression can take (a literal, or either arm of ``a if c else b``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _code_literals(node.body) + _code_literals(node.orelse)
    return []


def raised_codes() -> dict[str, str]:
    """code → "file:line" of one place that answers it, for every literal code in the tree."""
    trees = _trees()
    takers = {"DomainError", "ProtocolError"} | {
        node.name
        for _, tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.args.args and node.args.args[0].arg == "code"
    }
    found: dict[str, str] = {}

    def note(codes: list[str], path: Path, node: ast.AST) -> None:
        for code in codes:
            found.setdefault(code, f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}")

    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in takers:
                    note(_code_literals(node.args[0]), path, node)
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "code" and value is not None:
                        note(_code_literals(value), path, node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == "code":
                        note(_code_literals(node.value), path, node)
                    elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        for element, value in zip(target.elts, node.value.elts, strict=False):
                            if isinstance(element, ast.Name) and element.id == "code":
                                note(_code_literals(value), path, node)
    return found


def test_the_walk_finds_codes_in_each_form_it_is_meant_to_find():
    codes = raised_codes()
    assert {
        "session_superseded",  # DomainError("…")
        "json_duplicate_key",  # ProtocolError("…") in protocol/
        "body_too_large",  # {"code": "…"} built by hand (api/middleware.py)
        "host_not_allowed",  # code, field = "…", "…" (api/exceptions.py)
        "enrollment_token_used",  # a helper whose first parameter is `code`
        "attempt_already_started",  # DomainError("…" if … else "…")
    } <= set(codes)


@pytest.mark.parametrize("code,where", sorted(raised_codes().items()))
def test_every_answered_code_is_catalogued(code, where):
    assert code in CATALOGUE, f"{where} answers {code!r}, which protocol/errors.py does not catalogue"
