"""Drop the attempt's own index on ``run_id``: ``attempt_number_unique`` (run_id, number) serves
every lookup by run, and an attempt's state changes are not HOT updates (``state`` is in the
partial indexes' predicates), so each of them wrote this index again for nothing.

Only the index goes. Django's ``AlterField(db_index=False)`` would, on PostgreSQL, drop the first
single-column index it finds on ``run_id`` — that can be the partial unique index
``one_live_attempt_per_run`` — and re-add the foreign key (a scan of the table under lock); so
the state changes here and the database drops the index by its name (the same on both stores).
"""

import django.db.models.deletion
from django.db import migrations, models

INDEX = "runs_runattempt_run_id_158c4b4e"


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0007_state_checks_as_one_constant"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="runattempt",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempts",
                        to="runs.run",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "runs_runattempt" ("run_id")',
                ),
            ],
        ),
    ]
