"""The lease functions plan their statements once per connection (docs/performance.md, "The
functions' statements planned once").

A PL/pgSQL statement with parameters is planned by PostgreSQL's plan cache, which by default
plans it afresh for its parameter values on every call (a *custom* plan) until it judges a
generic plan no worse; for these functions' statements — a lookup by key, a keyset page of one
placement class, the writes of a claim — several kept a custom plan, about a tenth of a claimer
backend's CPU. ``plan_cache_mode = force_generic_plan`` set on the function makes each statement
planned once per connection and reused until the plan cache invalidates it (a schema change or
fresh statistics on a table it reads, as autovacuum's ``ANALYZE`` brings). Answers are unchanged;
only where the planning happens moves.

A plan made once is made from the statistics of that moment: a connection opened while the lease
table was nearly empty (a new installation, a benchmark's fresh fixture) planned the capacity,
replay and lease lookups as sequential scans and kept them while the table grew, each claim then
reading every lease row until autovacuum's next ``ANALYZE``. Every statement of these functions
reads its rows by key, so ``enable_seqscan = off`` is set on them too: an index is used whatever
the statistics say (a table with no usable index is still scanned, the setting only weighs
against it).

``CREATE OR REPLACE FUNCTION`` resets a function's settings, so a later migration that replaces
one of these functions must set them again: ``tests/plans/test_lease_function_plans.py`` checks
every function in :data:`FUNCTIONS` carries them.
"""

from django.db import migrations

#: The lease functions whose statements are planned once per connection.
FUNCTIONS = ("ql_lease_claim", "ql_lease_release", "ql_lease_ack", "ql_lease_complete")

_SIGNATURES = "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = ANY (%s)"


def _alter(schema_editor, clause: str) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite has no server functions (the Python paths serve it)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(_SIGNATURES, [list(FUNCTIONS)])
        signatures = [row[0] for row in cursor.fetchall()]
    for signature in signatures:
        schema_editor.execute(f"ALTER FUNCTION {signature} {clause}")


#: The settings each function carries (``proconfig``).
SETTINGS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"}


def plan_once(apps, schema_editor):
    for name, value in SETTINGS.items():
        _alter(schema_editor, f"SET {name} = {value}")


def plan_per_call(apps, schema_editor):
    for name in SETTINGS:
        _alter(schema_editor, f"RESET {name}")


class Migration(migrations.Migration):
    dependencies = [("leases", "0011_fewer_statements_per_claim_and_release")]

    operations = [migrations.RunPython(plan_once, plan_per_call, elidable=False)]
