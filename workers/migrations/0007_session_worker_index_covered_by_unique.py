"""Drop the session's own index on ``worker_id``: ``session_generation_unique`` (worker_id,
generation) serves every lookup by worker. As in runs 0008, only the index goes, by its name:
Django's ``AlterField(db_index=False)`` could drop the partial unique index
``one_live_session_per_worker`` instead and would re-add the foreign key.
"""

import django.db.models.deletion
from django.db import migrations, models

INDEX = "workers_workersession_worker_id_9eb34791"
RECREATE = f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "workers_workersession" ("worker_id")'


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0006_state_checks_as_one_constant"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="workersession",
                    name="worker",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="sessions",
                        to="workers.worker",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=RECREATE,
                ),
            ],
        ),
    ]
