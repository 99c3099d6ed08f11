"""The lease functions plan their statements once per connection (migration ``leases/0012``,
docs/performance.md "The functions' statements planned once"): the setting is on every one of
them, so a later ``CREATE OR REPLACE FUNCTION`` that drops it fails here. That the answers are
unchanged is the PostgreSQL leg's lease, race and contract tests, which run with it."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

FUNCTIONS = importlib.import_module("leases.migrations.0012_lease_functions_plan_once").FUNCTIONS


def test_every_lease_function_carries_the_plan_once_setting():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, coalesce(p.proconfig, '{}') FROM pg_proc p WHERE p.proname = ANY (%s)",
            [list(FUNCTIONS)],
        )
        settings = dict(cursor.fetchall())
    assert sorted(settings) == sorted(FUNCTIONS)
    for name, config in settings.items():
        assert "plan_cache_mode=force_generic_plan" in config, (name, config)
