"""The CHECK constraints over a list of states (or kinds, roles, policies) stated with
``core.lookups.one_of``: on PostgreSQL one ``text[]`` constant instead of one cast constant per
value, which each write statement parsed and folded again (docs/performance.md, "CHECK
constraints read as one constant"). The same rows pass and fail; on SQLite the checks stay
``IN (…)``."""

from django.db import migrations, models

import core.lookups


class Migration(migrations.Migration):
    dependencies = [
        ("leases", "0012_lease_functions_plan_once"),
        ("runs", "0007_state_checks_as_one_constant"),
        ("workers", "0006_state_checks_as_one_constant"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="rundispatchlease",
            name="lease_state_valid",
        ),
        migrations.RemoveConstraint(
            model_name="rundispatchlease",
            name="lease_release_reason_valid",
        ),
        migrations.AddConstraint(
            model_name="rundispatchlease",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("state"), ["leased", "completed", "released"]),
                name="lease_state_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="rundispatchlease",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(
                    models.F("release_reason"),
                    [
                        "",
                        "worker_release",
                        "dispatch_timeout",
                        "lease_expired",
                        "session_replaced",
                        "session_expired",
                        "session_offline",
                        "worker_revoked",
                        "cancelled",
                    ],
                ),
                name="lease_release_reason_valid",
            ),
        ),
    ]
