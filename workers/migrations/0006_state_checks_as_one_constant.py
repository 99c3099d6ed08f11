"""The CHECK constraints over a list of states (or kinds, roles, policies) stated with
``core.lookups.one_of``: on PostgreSQL one ``text[]`` constant instead of one cast constant per
value, which each write statement parsed and folded again (docs/performance.md, "CHECK
constraints read as one constant"). The same rows pass and fail; on SQLite the checks stay
``IN (…)``."""

from django.db import migrations, models

import core.lookups


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0005_merge_20261201_1012"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="worker",
            name="worker_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="workercredential",
            name="credential_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="workersession",
            name="session_state_valid",
        ),
        migrations.AddConstraint(
            model_name="worker",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("state"), ["active", "draining", "revoked"]),
                name="worker_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="workercredential",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("state"), ["active", "rotated", "revoked"]),
                name="credential_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="workersession",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(
                    models.F("state"), ["online", "draining", "offline", "fenced", "expired"]
                ),
                name="session_state_valid",
            ),
        ),
    ]
