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
        ("accounts", "0003_schedule_permissions"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="apitoken",
            name="api_token_role_valid",
        ),
        migrations.AddConstraint(
            model_name="apitoken",
            constraint=models.CheckConstraint(
                condition=core.lookups.OneOf(models.F("role"), ["viewer", "operator", "admin"]),
                name="api_token_role_valid",
            ),
        ),
    ]
