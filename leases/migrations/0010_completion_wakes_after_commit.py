"""``ql_lease_complete`` no longer sends the worker's wake-up; its caller does, once committed.

A ``NOTIFY`` holds one lock for the whole database from the notifying transaction's commit until
that commit is on disk, so a notification inside the durable completion queued every completing
(and releasing) transaction behind the one before it and its flush. The caller now sends the
wake-up after the completion has committed, in a statement of its own whose commit does not wait
for the disk (``core.wakeups``; docs/performance.md). What the function writes and answers is
unchanged; it loses its two last parameters (the channel and the payload).

The function is leases 0009's text with the parameters and the ``PERFORM pg_notify`` removed (each
removal is asserted to apply exactly once); reversing restores that text.
"""

import importlib

from django.db import migrations

_PARAMETERS = (",\n    p_channel text, p_wake text\n) RETURNS jsonb", "\n) RETURNS jsonb")
_NOTIFY = (
    "    PERFORM pg_notify(p_channel, p_wake);  -- the lease ended: wake the worker's waiting requests\n",
    "",
)

_SIGNATURE = (
    "uuid, uuid, bigint, uuid, integer, text, uuid, integer, integer, "
    "text, integer, text, text, text, text[], text[], text[], interval[], jsonb"
)
_DROP_PREVIOUS = f"DROP FUNCTION ql_lease_complete({_SIGNATURE}, text, text)"
_DROP = f"DROP FUNCTION ql_lease_complete({_SIGNATURE})"


def _previous() -> str:
    return importlib.import_module("leases.migrations.0009_lease_lookups_by_unique_key")._rewritten(
        "COMPLETE"
    )


def _rewritten() -> str:
    text = _previous()
    for old, new in (_PARAMETERS, _NOTIFY):
        if text.count(old) != 1:
            raise RuntimeError("leases 0010: a part to remove is not in ql_lease_complete exactly once")
        text = text.replace(old, new)
    return text


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_DROP_PREVIOUS)
        schema_editor.execute(_rewritten())


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_DROP)
        schema_editor.execute(_previous())


class Migration(migrations.Migration):
    dependencies = [("leases", "0009_lease_lookups_by_unique_key")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
