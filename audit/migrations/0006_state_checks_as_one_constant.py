"""The CHECK constraints over a list of states (or kinds, roles, policies) stated with
``core.lookups.one_of``: on PostgreSQL one ``text[]`` constant instead of one cast constant per
value, which each write statement parsed and folded again (docs/performance.md, "CHECK
constraints read as one constant"). The same rows pass and fail; on SQLite the checks stay
``IN (…)``."""

from django.db import migrations, models

import core.lookups


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0005_claim_loop_indexes"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="event",
            name="event_actor_type_valid",
        ),
        migrations.AddConstraint(
            model_name="event",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(
                    models.F("actor_type"),
                    ["worker", "operator", "api_app", "system", "reconciler", "scheduler"],
                ),
                name="event_actor_type_valid",
            ),
        ),
    ]
