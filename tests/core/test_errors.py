"""The error catalogue: documented, complete, and every code the code base raises is in it."""

import re
from pathlib import Path

from console.management.commands.error_codes import render
from core.errors import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["qinglong", "workers", "runs", "placement", "leases", "protocol", "audit"]


def test_docs_errors_md_is_generated_from_the_catalogue():
    assert (ROOT / "docs" / "errors.md").read_text() == render(), (
        "run: manage.py error_codes > docs/errors.md"
    )


def test_every_raised_code_is_catalogued():
    raised = set()
    pattern = re.compile(r'(?:DomainError|ProtocolError)\(\s*"([a-z_]+)"')
    for package in SOURCES:
        for path in (ROOT / package).rglob("*.py"):
            raised |= set(pattern.findall(path.read_text()))
    assert raised, "the pattern found nothing: the test would be vacuous"
    assert raised <= set(CATALOGUE), sorted(raised - set(CATALOGUE))


def test_statuses_are_client_or_unavailable_errors():
    """4xx or 503 — except ``internal_error``, the one 500: the answer to a fault no handler
    expected (``api.exceptions.server_error``), never raised as a refusal."""
    statuses = {code: spec.status for code, spec in CATALOGUE.items()}
    assert statuses.pop("internal_error") == 500
    assert all(400 <= status < 500 or status == 503 for status in statuses.values())


def test_no_code_raises_internal_error():
    pattern = re.compile(r'(?:DomainError|ProtocolError)\(\s*"internal_error"')
    for package in [*SOURCES, "api", "actions"]:
        for path in (ROOT / package).rglob("*.py"):
            assert not pattern.search(path.read_text()), path
