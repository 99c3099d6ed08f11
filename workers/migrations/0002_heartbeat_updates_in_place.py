"""Let a lease-extending heartbeat update the session row in place (PostgreSQL HOT update).

Dropping the index on (state, lease_expires_at) leaves the extension changing no indexed column;
a fill factor of 70 leaves room on each page for the new row version. Measured with
`make bench-heartbeat` (docs/sessions.md). SQLite has no fill factor: only the index goes.
"""

from django.db import migrations


def set_fillfactor(apps, schema_editor, value: int) -> None:
    if schema_editor.connection.vendor == "postgresql":
        table = schema_editor.quote_name(apps.get_model("workers", "WorkerSession")._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {value})")


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0001_initial"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="workersession", name="session_state_expiry"),
        migrations.RunPython(
            lambda apps, editor: set_fillfactor(apps, editor, 70),
            lambda apps, editor: set_fillfactor(apps, editor, 100),
        ),
    ]
