"""``core.lookups.one_of``: the CHECK constraints over value lists are one constant on PostgreSQL
(docs/performance.md, "CHECK constraints read as one constant"), and the condition means the
same on both stores. That the constraints still refuse what they refused is tests/runs/test_states.py."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection

from core.lookups import one_of
from runs.models import Run
from runs.states import RUN_TERMINAL
from tests.helpers import enqueue, make_revision

pytestmark = pytest.mark.django_db


def _project_tables() -> list[str]:
    return [
        model._meta.db_table
        for app in ("accounts", "audit", "workers", "runs", "leases", "logs", "schedules")
        for model in apps.get_app_config(app).get_models()
    ]


@pytest.mark.postgres
def test_no_check_constraint_builds_its_value_list_per_statement():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE contype = 'c' AND conrelid::regclass::text = ANY (%s)",
            [_project_tables()],
        )
        checks = cursor.fetchall()
    built = [(table, name) for table, name, definition in checks if "ARRAY[" in definition]
    assert built == []
    definitions = {name: definition for _, name, definition in checks}
    assert "= ANY ('{created,queued," in definitions["run_state_valid"]
    assert '\'{"",worker_release,' in definitions["lease_release_reason_valid"]  # '' is a value


def test_one_of_selects_the_same_rows_as_in():
    revision = make_revision()
    queued = enqueue(revision)
    assert list(Run.objects.filter(one_of("state", ["queued", "dispatching"]))) == [queued]
    assert not Run.objects.filter(one_of("state", RUN_TERMINAL)).exists()
    assert list(Run.objects.filter(~one_of("state", RUN_TERMINAL))) == [queued]
    assert Run.objects.filter(one_of("state", ["queued"]) | one_of("state", ["x"])).count() == 1
