"""Operator roles as data: which permissions each group holds (``docs/operators.md``).

Three groups — ``viewer``, ``operator``, ``admin`` — are created and kept equal to
:data:`ROLE_PERMISSIONS` by the data migrations of this app (a test compares the migrated
groups with this table, so a change here needs a migration). A superuser holds every
permission; a staff user in no group holds none. An API token is scoped to one role: it acts
with the permissions its user holds *and* its role grants (:func:`token_allows`).
"""

from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


#: Reads everything an operator console shows; secrets are never readable by anyone (tokens are
#: digests), and API tokens are listed only to admins.
_VIEW = frozenset(
    {
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
)
#: Day-to-day work on the fleet and the runs.
_OPERATE = _VIEW | {"workers.drain_worker", "runs.run_task", "runs.cancel_run", "runs.retry_run"}
#: Identity, fleet membership, task definitions and users.
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

ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    Role.VIEWER: _VIEW,
    Role.OPERATOR: frozenset(_OPERATE),
    Role.ADMIN: frozenset(_ADMINISTER),
}


def token_allows(role: str, permission: str) -> bool:
    """Whether a token scoped to ``role`` may use ``permission`` ("app_label.codename")."""
    return permission in ROLE_PERMISSIONS.get(role, frozenset())


def holds_role(user, role: str) -> bool:
    """Whether an active ``user`` holds every permission of ``role`` (a superuser holds all)."""
    if not user.is_active or role not in ROLE_PERMISSIONS:
        return False
    return user.is_superuser or all(user.has_perm(name) for name in ROLE_PERMISSIONS[role])


def role_of(user, token_role: str | None = None) -> str:
    """The role an act is audited under: the token's role when the act came with a token, else
    ``superuser``, the highest role group the user is in, or ``none``. ``user``: a Django user."""
    if token_role:
        return token_role
    if user is None or not getattr(user, "is_authenticated", False):
        return "none"
    if user.is_superuser:
        return "superuser"
    groups = set(user.groups.values_list("name", flat=True))
    for role in (Role.ADMIN, Role.OPERATOR, Role.VIEWER):
        if role in groups:
            return str(role)
    return "none"


def sync_role_groups(group_model, permission_model, table: dict[str, frozenset[str]]) -> None:
    """Make each role's group hold exactly ``table[role]`` (used by this app's migrations, with
    their historical models). Raises LookupError naming a permission that does not exist."""
    for role, wanted in table.items():
        group, _ = group_model.objects.get_or_create(name=role)
        found = []
        for name in sorted(wanted):
            app_label, codename = name.split(".", 1)
            permission = permission_model.objects.filter(
                content_type__app_label=app_label, codename=codename
            ).first()
            if permission is None:
                raise LookupError(f"permission {name} does not exist")
            found.append(permission)
        group.permissions.set(found)
