"""Let a claim and a release update the attempt row in place (PostgreSQL HOT update).

Without the index on ``worker_id`` the claim's projection (lease generation, expiry, worker,
session) changes no indexed column; fill factors of 85 on runs and 50 on attempts leave room on each
page for the new row versions (docs/performance.md). SQLite: only the index goes.
"""

import django.db.models.deletion
from django.db import migrations, models

#: Fill factors: an attempt row is rewritten by claim, release, both ACKs, renewals and the
#: completion, a run row by claim and completion; 50 and 85 kept those updates HOT in
#: ``make bench-claim`` (85 on attempts left two in three updates non-HOT).
FILLFACTORS = {"Run": 85, "RunAttempt": 50}


def set_fillfactor(apps, schema_editor, default: bool = False) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for model, value in FILLFACTORS.items():
            table = schema_editor.quote_name(apps.get_model("runs", model)._meta.db_table)
            schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {100 if default else value})")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0004_operator_permissions_retry_of_protect_attempts"),
        ("workers", "0005_merge_20261201_1012"),
    ]

    operations = [
        migrations.AlterField(
            model_name="runattempt",
            name="worker",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="attempts",
                to="workers.worker",
            ),
        ),
        migrations.RunPython(
            lambda apps, editor: set_fillfactor(apps, editor),
            lambda apps, editor: set_fillfactor(apps, editor, default=True),
        ),
    ]
