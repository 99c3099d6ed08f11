"""The three role groups (viewer, operator, admin) with their permissions, and the end of DRF's
plaintext tokens (``docs/operators.md``).

The table is frozen here as of this migration; ``accounts.roles.ROLE_PERMISSIONS`` is the live
one, and ``tests/accounts/test_roles.py`` fails when the migrated groups and that table differ
(a change to the table then needs a migration like this one). Permissions are normally created
after ``migrate`` finishes; this migration creates them first, so that it can grant them.
DRF's ``authtoken_token`` table, which kept every API token in plaintext, is dropped: such
tokens stop working and are replaced by digest-only tokens (``accounts.ApiToken``).
"""

from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions
from django.db import migrations

from accounts.roles import sync_role_groups

_VIEW = {
    "workers.view_worker",
    "workers.view_workersession",
    "workers.view_workercredential",
    "workers.view_enrollmenttoken",
    "runs.view_task",
    "runs.view_taskrevision",
    "runs.view_run",
    "runs.view_runattempt",
    "leases.view_rundispatchlease",
    "audit.view_event",
}
_OPERATE = _VIEW | {"workers.drain_worker", "runs.run_task", "runs.cancel_run", "runs.retry_run"}
_ADMINISTER = _OPERATE | {
    "workers.add_worker",
    "workers.change_worker",
    "workers.issue_enrollment_token",
    "workers.revoke_worker",
    "workers.rotate_worker_credential",
    "workers.force_offline_worker",
    "runs.add_task",
    "runs.change_task",
    "runs.add_taskrevision",
    "auth.view_user",
    "auth.add_user",
    "auth.change_user",
    "auth.view_group",
    "accounts.view_apitoken",
    "accounts.add_apitoken",
    "accounts.delete_apitoken",
}
ROLES = {"viewer": frozenset(_VIEW), "operator": frozenset(_OPERATE), "admin": frozenset(_ADMINISTER)}


def groups_forward(apps, schema_editor):
    for app_config in global_apps.get_app_configs():
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    sync_role_groups(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"), ROLES)


def groups_backward(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


def drop_plaintext_tokens(apps, schema_editor):
    if "authtoken_token" in schema_editor.connection.introspection.table_names():
        schema_editor.execute("DROP TABLE authtoken_token")


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("audit", "0001_initial"),
        ("workers", "0004_operator_permissions_protect_sessions"),
        ("runs", "0004_operator_permissions_retry_of_protect_attempts"),
        ("leases", "0003_protect_lease_references"),
    ]

    operations = [
        migrations.RunPython(groups_forward, groups_backward),
        migrations.RunPython(drop_plaintext_tokens, migrations.RunPython.noop),
    ]
