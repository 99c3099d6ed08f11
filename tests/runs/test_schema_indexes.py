"""The indexes on the run and session foreign keys, as migrated, on both stores (runs 0008,
workers 0007): the invariants' partial unique indexes stay, the composite unique indexes serve
the lookups by run or worker, and no second index on the bare foreign key is written on every
state change."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def _indexes(table: str) -> dict[str, tuple[tuple[str, ...], bool]]:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return {
        name: (tuple(facts["columns"]), bool(facts["unique"]))
        for name, facts in constraints.items()
        if facts["index"] or facts["unique"]
    }


@pytest.mark.parametrize(
    ("table", "column", "covering", "partial"),
    [
        ("runs_runattempt", "run_id", "attempt_number_unique", "one_live_attempt_per_run"),
        ("workers_workersession", "worker_id", "session_generation_unique", "one_live_session_per_worker"),
    ],
)
def test_a_foreign_key_is_served_by_its_composite_unique_index_alone(table, column, covering, partial):
    indexes = _indexes(table)
    assert indexes[partial] == ((column,), True)  # the one-live-row invariant
    assert indexes[covering][0][0] == column and indexes[covering][1]
    bare = [name for name, (columns, unique) in indexes.items() if columns == (column,) and not unique]
    assert bare == []
