"""``ql_log_append`` reads the session by its key alone and compares its worker afterwards, as
the lease functions do since leases ``0016`` (docs/performance.md, "A worker's calls grew slower
with each restart"): a plan that took the index on ``worker_id`` read every session the worker
ever had before its live one. Answers are unchanged; reversing restores logs ``0003``'s text.
"""

import importlib

from django.db import migrations

_APPEND = importlib.import_module("logs.migrations.0003_append_function")
_SESSION = importlib.import_module("leases.migrations.0016_session_read_by_its_key")

APPEND = _SESSION.rewritten(_APPEND.APPEND, [_SESSION.SESSION_BY_KEY])


def by_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(APPEND)


def by_key_and_worker(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_APPEND.APPEND)


class Migration(migrations.Migration):
    dependencies = [
        ("logs", "0004_state_checks_as_one_constant"),
        ("leases", "0016_session_read_by_its_key"),
    ]

    operations = [migrations.RunPython(by_key, by_key_and_worker, elidable=False)]
