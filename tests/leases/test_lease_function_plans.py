"""The lease functions plan their statements once per connection (migration ``leases/0012``,
docs/performance.md "The functions' statements planned once"): the setting is on every one of
them, so a later ``CREATE OR REPLACE FUNCTION`` that drops them fails here, and a connection that
planned its claim while the lease table was nearly empty still reads leases by index once the
table has grown. That the answers are unchanged is the PostgreSQL leg's lease, race and contract
tests, which run with them."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection

from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, release

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

_MIGRATION = importlib.import_module("leases.migrations.0012_lease_functions_plan_once")
FUNCTIONS, SETTINGS = _MIGRATION.FUNCTIONS, _MIGRATION.SETTINGS


def test_every_lease_function_carries_the_plan_once_settings():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, coalesce(p.proconfig, '{}') FROM pg_proc p WHERE p.proname = ANY (%s)",
            [list(FUNCTIONS)],
        )
        settings = dict(cursor.fetchall())
    assert sorted(settings) == sorted(FUNCTIONS)
    for name, config in settings.items():
        for setting, value in SETTINGS.items():
            assert f"{setting}={value}" in config, (name, config)


#: Copies of one released lease under new keys (``n`` of them), as a long-used table holds.
_GROW = """
INSERT INTO leases_rundispatchlease
SELECT (jsonb_populate_record(NULL::leases_rundispatchlease, to_jsonb(l) || jsonb_build_object(
        'id', gen_random_uuid(), 'offer_id', gen_random_uuid(), 'lease_generation', 1000 + g,
        'token_digest', md5(g::text) || md5(l.id::text)))).*
  FROM leases_rundispatchlease l, generate_series(1, %s) AS g
 WHERE l.id = (SELECT id FROM leases_rundispatchlease WHERE state = 'released' LIMIT 1)
"""


def _plans_of(act) -> list[str]:
    """The plans of the statements the server functions ``act()`` calls run (auto_explain)."""
    raw = connection.connection
    notices: list[str] = []

    def heard(diagnostic) -> None:
        notices.append(diagnostic.message_primary or "")

    raw.add_notice_handler(heard)
    with connection.cursor() as cursor:
        cursor.execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
            " SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = 'notice'"
        )
    try:
        act()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET auto_explain.log_min_duration = -1")
        raw.remove_notice_handler(heard)
    return notices


def test_a_claim_planned_on_a_nearly_empty_lease_table_reads_leases_by_index_once_it_has_grown(
    protocol_settings,
):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the function answers alone
    session = register(enrolled_worker())
    revision = make_revision()
    for _ in range(3):
        enqueue(revision)
    held = claim_one(session)  # this connection plans the claim's statements: one lease row
    release(held)
    release(claim_one(session))  # (the second call runs on the plans of the first)
    with connection.cursor() as cursor:
        cursor.execute(_GROW, [20_000])
    plans = _plans_of(lambda: release(claim_one(session)))
    assert any("ql_lease_claim" in plan for plan in plans), plans
    scans = [plan for plan in plans if "Seq Scan on leases_rundispatchlease" in plan]
    assert scans == [], scans[0]
