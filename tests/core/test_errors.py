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
    assert all(400 <= spec.status < 500 or spec.status == 503 for spec in CATALOGUE.values())
