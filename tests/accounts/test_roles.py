"""Roles as data (issue 11): the migrated groups hold exactly the live role table, each operator
act has its permission, and a superuser holds every permission without a group."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.db import connection

from accounts.roles import ROLE_PERMISSIONS, Role, role_of, token_allows
from tests.helpers import operator_user

pytestmark = pytest.mark.django_db

OPERATOR_ACTS = {
    "workers.issue_enrollment_token",
    "workers.drain_worker",
    "workers.revoke_worker",
    "workers.rotate_worker_credential",
    "workers.force_offline_worker",
    "runs.run_task",
    "runs.cancel_run",
    "runs.retry_run",
}


#: The newest migration that freezes the role table (each change to the table adds one).
LATEST_ROLES = "accounts.migrations.0003_schedule_permissions"


def _held(group: Group) -> set[str]:
    return {
        f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")
    }


def test_the_migrations_left_the_groups_equal_to_the_role_table():
    # Not ensure_role_groups(): these are the rows the migration writes. A transactional test
    # earlier in this process may have flushed them; then the migration's own step runs again.
    if Group.objects.filter(name__in=Role.values).count() != len(Role.values):
        editor = SimpleNamespace(connection=connection)  # the step reads only the connection's alias
        importlib.import_module(LATEST_ROLES).groups_forward(apps, editor)
    groups = {group.name: _held(group) for group in Group.objects.filter(name__in=Role.values)}
    assert groups == {role: set(permissions) for role, permissions in ROLE_PERMISSIONS.items()}


def test_the_migration_table_is_the_live_table():
    """A change to accounts.roles needs a new migration; this test says so."""
    migration = importlib.import_module(LATEST_ROLES)
    assert migration.ROLES == ROLE_PERMISSIONS


def test_every_operator_act_has_a_permission_and_the_roles_nest():
    existing = {
        f"{p.content_type.app_label}.{p.codename}" for p in Permission.objects.select_related("content_type")
    }
    assert OPERATOR_ACTS <= existing
    viewer, operator, admin = (ROLE_PERMISSIONS[r] for r in (Role.VIEWER, Role.OPERATOR, Role.ADMIN))
    assert viewer < operator < admin
    assert not viewer & OPERATOR_ACTS
    assert operator & OPERATOR_ACTS == {
        "workers.drain_worker",
        "runs.run_task",
        "runs.cancel_run",
        "runs.retry_run",
    }
    assert OPERATOR_ACTS <= admin
    # nobody but a superuser deletes what the audit trail and the fences point at
    assert not any(p.split(".")[1].startswith("delete_") for p in admin if not p.startswith("accounts."))


def test_a_superuser_holds_everything_and_a_staff_user_in_no_group_nothing():
    root = operator_user("root", superuser=True)
    nobody = operator_user("nobody")
    assert all(root.has_perm(p) for p in OPERATOR_ACTS | ROLE_PERMISSIONS[Role.ADMIN])
    assert not any(nobody.has_perm(p) for p in ROLE_PERMISSIONS[Role.VIEWER])
    assert (role_of(root), role_of(nobody)) == ("superuser", "none")
    assert role_of(operator_user("ops", role="operator")) == "operator"


def test_a_token_role_caps_its_permissions():
    assert token_allows("viewer", "runs.view_run") and not token_allows("viewer", "runs.run_task")
    assert token_allows("operator", "runs.run_task") and not token_allows("operator", "workers.revoke_worker")
    assert not token_allows("root", "runs.view_run")
