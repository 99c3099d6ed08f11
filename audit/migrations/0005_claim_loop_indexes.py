"""Fewer index entries per claim → release loop (docs/performance.md, "Claim and release"): the
worker index skips events without a worker (``run.dispatching`` and the other run facts), and the
kind index skips the two kinds of the loop that nothing reads by kind (``KIND_INDEX_EXCLUDES``).
Every query that used either index still can: each names a worker, or a kind the index keeps.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0004_control_plane_beat"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="event", name="event_worker_kind_time"),
        migrations.RemoveIndex(model_name="event", name="event_kind_time"),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("worker_id__isnull", False)),
                fields=["worker_id", "kind", "created_at"],
                name="event_worker_kind_time",
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("kind__in", ("lease.released", "run.dispatching")), _negated=True),
                fields=["kind", "created_at"],
                name="event_kind_time",
            ),
        ),
    ]
