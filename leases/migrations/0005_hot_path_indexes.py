"""Fewer index entries per claim and release: drop the single-column indexes on the lease's
attempt, worker and session (composite indexes lead with each) and make the token digest unique
by a constraint, without the ``varchar_pattern_ops`` twin ``unique=True`` adds (docs/performance.md).
"""

import django.db.models.deletion
from django.db import migrations, models


def restore_constraints(apps, schema_editor):
    """Re-create any constraint of the lease the field changes above dropped with the FK index.

    On PostgreSQL, ``AlterField(db_index=False)`` drops every single-column index on the column,
    and the partial unique index ``one_active_lease_per_attempt`` (attempt WHERE leased) is one.
    """
    model = apps.get_model("leases", "RunDispatchLease")
    with schema_editor.connection.cursor() as cursor:
        existing = schema_editor.connection.introspection.get_constraints(cursor, model._meta.db_table)
    for constraint in model._meta.constraints:
        if constraint.name not in existing:
            schema_editor.add_constraint(model, constraint)


class Migration(migrations.Migration):
    dependencies = [
        ("leases", "0004_claim_release_functions"),
        ("runs", "0004_operator_permissions_retry_of_protect_attempts"),
        ("workers", "0005_merge_20261201_1012"),
    ]

    operations = [
        migrations.AlterField(
            model_name="rundispatchlease",
            name="attempt",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="leases",
                to="runs.runattempt",
            ),
        ),
        migrations.AlterField(
            model_name="rundispatchlease",
            name="session",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="leases",
                to="workers.workersession",
            ),
        ),
        migrations.AlterField(
            model_name="rundispatchlease",
            name="token_digest",
            field=models.CharField(editable=False, max_length=64),
        ),
        migrations.AlterField(
            model_name="rundispatchlease",
            name="worker",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="leases",
                to="workers.worker",
            ),
        ),
        migrations.AddConstraint(
            model_name="rundispatchlease",
            constraint=models.UniqueConstraint(fields=("token_digest",), name="lease_token_digest_unique"),
        ),
        migrations.RunPython(restore_constraints, migrations.RunPython.noop),
    ]
