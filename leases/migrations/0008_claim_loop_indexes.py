"""Fewer index entries per claim and release (docs/performance.md, "Claim and release"): the
session index holds active leases only (every read by session wants those, and the released row
a release writes then enters it no more), and the run's single-column index goes (a run's leases
are read through its attempts, ``lease_generation_unique``).
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("leases", "0007_completion_function"),
        ("runs", "0006_merge_20261201_1229"),
        ("workers", "0005_merge_20261201_1012"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="rundispatchlease", name="lease_session_state"),
        migrations.AlterField(
            model_name="rundispatchlease",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="leases",
                to="runs.run",
            ),
        ),
        migrations.AddIndex(
            model_name="rundispatchlease",
            index=models.Index(
                condition=models.Q(("state", "leased")), fields=["session"], name="lease_active_session"
            ),
        ),
    ]
