"""The CHECK constraints over a list of states (or kinds, roles, policies) stated with
``core.lookups.one_of``: on PostgreSQL one ``text[]`` constant instead of one cast constant per
value, which each write statement parsed and folded again (docs/performance.md, "CHECK
constraints read as one constant"). The same rows pass and fail; on SQLite the checks stay
``IN (…)``."""

import django.db.models.expressions
from django.conf import settings
from django.db import migrations, models

import core.lookups


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0006_merge_20261201_1229"),
        ("workers", "0006_state_checks_as_one_constant"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="run",
            name="run_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="run",
            name="run_terminal_has_end",
        ),
        migrations.RemoveConstraint(
            model_name="run",
            name="run_live_has_no_end",
        ),
        migrations.RemoveConstraint(
            model_name="runattempt",
            name="attempt_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="runattempt",
            name="attempt_terminal_has_end",
        ),
        migrations.RemoveConstraint(
            model_name="runattempt",
            name="attempt_live_has_no_end",
        ),
        migrations.RemoveConstraint(
            model_name="runattempt",
            name="attempt_started_under_a_lease",
        ),
        migrations.RemoveConstraint(
            model_name="taskrevision",
            name="revision_lost_retry_valid",
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(
                    models.F("state"),
                    [
                        "created",
                        "queued",
                        "dispatching",
                        "running",
                        "retry_wait",
                        "lost",
                        "succeeded",
                        "failed",
                        "cancelled",
                        "timed_out",
                    ],
                ),
                name="run_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    django.db.models.expressions.NegatedExpression(
                        core.lookups.OneOf(
                            models.F("state"), ["succeeded", "failed", "cancelled", "timed_out"]
                        )
                    ),
                    models.Q(("finished_at__isnull", False)),
                    _connector="OR",
                ),
                name="run_terminal_has_end",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    core.lookups.OneOf(models.F("state"), ["succeeded", "failed", "cancelled", "timed_out"]),
                    models.Q(("finished_at__isnull", True)),
                    _connector="OR",
                ),
                name="run_live_has_no_end",
            ),
        ),
        migrations.AddConstraint(
            model_name="runattempt",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(
                    models.F("state"),
                    [
                        "claimed",
                        "starting",
                        "running",
                        "succeeded",
                        "failed",
                        "cancelled",
                        "timed_out",
                        "lost",
                    ],
                ),
                name="attempt_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="runattempt",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    django.db.models.expressions.NegatedExpression(
                        core.lookups.OneOf(
                            models.F("state"), ["succeeded", "failed", "cancelled", "timed_out", "lost"]
                        )
                    ),
                    models.Q(("finished_at__isnull", False)),
                    _connector="OR",
                ),
                name="attempt_terminal_has_end",
            ),
        ),
        migrations.AddConstraint(
            model_name="runattempt",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    core.lookups.OneOf(
                        models.F("state"), ["succeeded", "failed", "cancelled", "timed_out", "lost"]
                    ),
                    models.Q(("finished_at__isnull", True)),
                    _connector="OR",
                ),
                name="attempt_live_has_no_end",
            ),
        ),
        migrations.AddConstraint(
            model_name="runattempt",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    django.db.models.expressions.NegatedExpression(
                        core.lookups.OneOf(models.F("state"), ["starting", "running"])
                    ),
                    models.Q(("session_id__isnull", False), ("lease_generation__gte", 1)),
                    _connector="OR",
                ),
                name="attempt_started_under_a_lease",
            ),
        ),
        migrations.AddConstraint(
            model_name="taskrevision",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("lost_retry"), ["never", "idempotent", "deduplicated"]),
                name="revision_lost_retry_valid",
            ),
        ),
    ]
