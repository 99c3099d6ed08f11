"""The CHECK constraints over a list of states (or kinds, roles, policies) stated with
``core.lookups.one_of``: on PostgreSQL one ``text[]`` constant instead of one cast constant per
value, which each write statement parsed and folded again (docs/performance.md, "CHECK
constraints read as one constant"). The same rows pass and fail; on SQLite the checks stay
``IN (…)``."""

from django.conf import settings
from django.db import migrations, models

import core.lookups


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0007_state_checks_as_one_constant"),
        ("schedules", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="schedule",
            name="schedule_overlap_valid",
        ),
        migrations.RemoveConstraint(
            model_name="schedule",
            name="schedule_misfire_valid",
        ),
        migrations.RemoveConstraint(
            model_name="schedulefire",
            name="schedule_fire_outcome_valid",
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("overlap"), ["skip", "queue_one", "allow"]),
                name="schedule_overlap_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("misfire"), ["run_once", "skip"]),
                name="schedule_misfire_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedulefire",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(
                    models.F("outcome"), ["queued", "deferred", "skipped_overlap", "skipped_misfire"]
                ),
                name="schedule_fire_outcome_valid",
            ),
        ),
    ]
