"""Schedules take the permissions of tasks (``docs/schedules.md``): viewers read them, admins
create and change them (and disable rather than delete: like a task, only a superuser deletes
one). The whole table is frozen here again, as in ``0002``."""

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
    "schedules.view_schedule",
    "schedules.view_schedulefire",
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
    "schedules.add_schedule",
    "schedules.change_schedule",
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


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0002_role_groups"),
        ("schedules", "0001_initial"),
    ]

    operations = [migrations.RunPython(groups_forward, migrations.RunPython.noop)]
