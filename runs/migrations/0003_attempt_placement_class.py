"""Index the dispatch queue per placement class as well (runs.selectors.placement_class_heads).

A claim used to scan the queue head in pages and could starve: a run its worker can take,
queued behind more work than the scan reaches that only other (or absent) workers can run, was
never reached. Each attempt now carries its revision's placement digest, and a second partial
index keeps the queue ordered within each class, so a claim probes the head of every class it
matches — a bounded number of index probes, whatever the backlog.
"""

from django.db import migrations, models
from django.db.models import OuterRef, Q, Subquery


def copy_placement(apps, schema_editor):
    RunAttempt = apps.get_model("runs", "RunAttempt")
    Run = apps.get_model("runs", "Run")
    RunAttempt.objects.update(
        placement_sha256=Subquery(
            Run.objects.filter(pk=OuterRef("run_id")).values("revision__placement_sha256")[:1]
        )
    )


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0002_state_machine_constraints"),
    ]

    operations = [
        migrations.AddField(
            model_name="runattempt",
            name="placement_sha256",
            field=models.CharField(default="", editable=False, max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(copy_placement, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="runattempt",
            index=models.Index(
                "placement_sha256",
                models.F("priority").desc(),
                "ready_at",
                "id",
                condition=Q(state="claimed"),
                name="attempt_dispatch_by_placement",
            ),
        ),
    ]
