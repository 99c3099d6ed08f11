"""The CHECK constraints over a list of states (or kinds, roles, policies) stated with
``core.lookups.one_of``: on PostgreSQL one ``text[]`` constant instead of one cast constant per
value, which each write statement parsed and folded again (docs/performance.md, "CHECK
constraints read as one constant"). The same rows pass and fail; on SQLite the checks stay
``IN (…)``."""

from django.db import migrations, models

import core.lookups


class Migration(migrations.Migration):
    dependencies = [
        ("logs", "0003_append_function"),
        ("runs", "0007_state_checks_as_one_constant"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="artifact",
            name="artifact_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="logchunk",
            name="logchunk_stream_valid",
        ),
        migrations.AddConstraint(
            model_name="artifact",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("state"), ["receiving", "stored"]),
                name="artifact_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="logchunk",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("stream"), ["stdout", "stderr"]),
                name="logchunk_stream_valid",
            ),
        ),
    ]
