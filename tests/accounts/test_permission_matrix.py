"""The permission matrix (issue 11): every state-changing operator API call and every admin
action, for each kind of user — viewer, operator, admin, a staff user in no group, superuser.
An allowed act succeeds and changes the database; a refused one answers 403 (API) or a
permission message (admin) and changes no row in any table."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group

from accounts.models import ApiToken
from actions.schedules import schedule_create
from audit.models import Event
from console.admin.base import ReadOnlyAdmin
from runs.models import Task
from schedules.rules import ScheduleSpec
from tests.accounts.world import ROLES, World, build_world, changed_tables, fingerprint, token_of, user_in
from tests.api.test_routes import routes
from tests.helpers import api_token, operator_user

pytestmark = pytest.mark.django_db

OPERATE = {"operator", "admin", "superuser"}
ADMINISTER = {"admin", "superuser"}
SUPERUSER = {"superuser"}

# --- the operator API -----------------------------------------------------------------------------

#: (name, method, path of the world, body of the world, who may)
API_ACTS: list[tuple[str, Callable[[World], str], Callable[[World], dict], set[str]]] = [
    ("create worker", lambda w: "/api/v1/ops/workers", lambda w: {"name": "new-box"}, ADMINISTER),
    (
        "issue enrollment token",
        lambda w: f"/api/v1/ops/workers/{w.worker.worker_id}/enrollment-tokens",
        lambda w: {},
        ADMINISTER,
    ),
    ("drain", lambda w: f"/api/v1/ops/workers/{w.worker.worker_id}/drain", lambda w: {}, OPERATE),
    ("undrain", lambda w: f"/api/v1/ops/workers/{w.draining.worker_id}/undrain", lambda w: {}, OPERATE),
    ("revoke", lambda w: f"/api/v1/ops/workers/{w.worker.worker_id}/revoke", lambda w: {}, ADMINISTER),
    ("rotate", lambda w: f"/api/v1/ops/workers/{w.worker.worker_id}/rotate", lambda w: {}, ADMINISTER),
    (
        "force offline",
        lambda w: f"/api/v1/ops/workers/{w.worker.worker_id}/offline",
        lambda w: {"force": True},
        ADMINISTER,
    ),
    (
        "create task",
        lambda w: "/api/v1/ops/tasks",
        lambda w: {"name": "another", "executor": "shell", "command": "true", "timeoutSeconds": 5},
        ADMINISTER,
    ),
    (
        "add revision",
        lambda w: f"/api/v1/ops/tasks/{w.task_name}/revisions",
        lambda w: {"executor": "shell", "command": "false", "timeoutSeconds": 5},
        ADMINISTER,
    ),
    ("run task", lambda w: "/api/v1/ops/runs", lambda w: {"task": w.task_name}, OPERATE),
    (
        "create schedule",
        lambda w: "/api/v1/ops/schedules",
        lambda w: {"task": w.task_name, "cron": "0 3 * * *"},
        ADMINISTER,
    ),
    ("cancel run", lambda w: f"/api/v1/ops/runs/{w.queued_run_id}/cancel", lambda w: {}, OPERATE),
    ("retry run", lambda w: f"/api/v1/ops/runs/{w.finished_run_id}/retry", lambda w: {}, OPERATE),
]


@pytest.mark.parametrize("kind", ROLES)
@pytest.mark.parametrize(("name", "path", "body", "allowed"), API_ACTS, ids=[a[0] for a in API_ACTS])
def test_operator_api_acts(client, kind, name, path, body, allowed):
    world = build_world()
    user = user_in(kind)
    headers = {"Authorization": f"Token {token_of(user, kind)}"}
    before = fingerprint()

    answer = client.post(path(world), body(world), content_type="application/json", headers=headers)

    changed = changed_tables(before, fingerprint())
    if kind in allowed:
        assert answer.status_code in (200, 201, 202), (name, kind, answer.json())
        assert "audit.event" in changed, (name, kind)
        role = "admin" if kind == "superuser" else kind  # the superuser acted with an admin-role token
        assert Event.objects.filter(actor=user.username, data__role=role).exists(), (name, kind)
    else:
        assert (answer.status_code, answer.json()["code"]) == (403, "permission_denied"), (name, kind)
        assert changed == [], (name, kind, changed)


def test_every_state_changing_operator_route_is_in_the_matrix():
    walked = {path(_fake_world()).split("/api/v1/ops/")[1] for _, path, _, _ in API_ACTS}
    posting = set()
    for route, view in routes():
        if route.startswith("/api/v1/ops/") and hasattr(view, "post") and "POST" in view.permissions:
            posting.add(route.removeprefix("/api/v1/ops/"))
    shapes = {_shape(p) for p in walked}
    assert {_shape(p) for p in posting} == shapes


def _shape(path: str) -> str:
    parts = []
    for part in path.split("/"):
        parts.append("{}" if part.startswith("<") or _looks_like_id(part) or part == "matrix-task" else part)
    return "/".join(parts)


def _looks_like_id(part: str) -> bool:
    return len(part) == 36 and part.count("-") == 4


def _fake_world() -> World:
    fake = "01900000-0000-7000-8000-000000000000"

    class Any:
        worker_id = fake

    return World(Any, None, Any, "matrix-task", fake, fake, fake)


# --- the admin --------------------------------------------------------------------------------------

#: (model label, action name) → who may, and which object of the world it acts on.
ADMIN_ACTS: dict[tuple[str, str], tuple[set[str], Callable[[World], object]]] = {
    ("workers.worker", "issue_enrollment_token"): (ADMINISTER, lambda w: w.worker.worker_id),
    ("workers.worker", "drain"): (OPERATE, lambda w: w.worker.worker_id),
    ("workers.worker", "undrain"): (OPERATE, lambda w: w.draining.worker_id),
    ("workers.worker", "revoke"): (ADMINISTER, lambda w: w.worker.worker_id),
    ("workers.worker", "force_offline"): (ADMINISTER, lambda w: w.worker.worker_id),
    ("workers.worker", "force_rotation"): (ADMINISTER, lambda w: w.worker.worker_id),
    ("runs.task", "run_now"): (OPERATE, lambda w: _task_pk(w)),
    ("runs.run", "cancel"): (OPERATE, lambda w: w.queued_run_id),
    ("runs.run", "retry"): (OPERATE, lambda w: w.finished_run_id),
    ("accounts.apitoken", "delete_selected"): (ADMINISTER, lambda w: _some_token()),
    ("schedules.schedule", "delete_selected"): ({"superuser"}, lambda w: _some_schedule(w)),
    ("auth.user", "delete_selected"): (SUPERUSER, lambda w: _bystander()),
    ("auth.group", "delete_selected"): (SUPERUSER, lambda w: _group("viewer")),
}


def _task_pk(world):
    return Task.objects.get(name=world.task_name).pk


def _some_token():
    api_token(operator_user("token-holder", role="viewer"), role="viewer")
    return ApiToken.objects.get(user__username="token-holder").pk


def _some_schedule(world: World):
    """A schedule on the world's task, made through its write path (deleting it is an admin act)."""
    return schedule_create(task_id=_task_pk(world), spec=ScheduleSpec(cron="0 3 * * *")).pk


def _bystander():
    return operator_user("bystander").pk


def _group(name):
    return Group.objects.get(name=name).pk


def _declared_actions() -> set[tuple[str, str]]:
    """Every action of every registered admin, Django's site-wide ``delete_selected`` included
    where the admin could ever allow deletion."""
    found = set()
    for model, model_admin in admin.site._registry.items():
        names = {getattr(a, "__name__", a) for a in (model_admin.actions or ())}
        if (
            model_admin.actions is not None
            and type(model_admin).has_delete_permission is not _read_only_delete()
        ):
            names |= set(dict(admin.site.actions))
        found |= {(model._meta.label_lower, name) for name in names}
    return found


def _read_only_delete():
    return ReadOnlyAdmin.has_delete_permission


def test_every_admin_action_is_in_the_matrix():
    declared = _declared_actions()
    # WorkerAdmin and TaskAdmin refuse deletion outright: their delete_selected is never offered.
    never_offered = {("workers.worker", "delete_selected"), ("runs.task", "delete_selected")}
    assert declared - never_offered == set(ADMIN_ACTS)


@pytest.mark.parametrize("kind", ROLES)
@pytest.mark.parametrize(
    ("label", "action"), sorted(ADMIN_ACTS), ids=[f"{m}:{a}" for m, a in sorted(ADMIN_ACTS)]
)
def test_admin_actions(client, kind, label, action):
    allowed, target = ADMIN_ACTS[(label, action)]
    world = build_world()
    user = user_in(kind)
    pk = target(world)
    client.force_login(user)
    app_label, model_name = label.split(".")
    url = f"/admin/{app_label}/{model_name}/"
    form = {"action": action, "_selected_action": [str(pk)], "index": "0"}
    if action == "delete_selected":
        form["post"] = "yes"
    before = fingerprint()

    answer = client.post(url, form, follow=True)

    changed = changed_tables(before, fingerprint())
    shown = " ".join(str(m) for m in answer.context["messages"]) if answer.context else ""
    if kind in allowed:
        assert answer.status_code == 200 and changed, (label, action, kind, shown)
        assert "You do not have permission" not in shown, (label, action, kind, shown)
    else:
        assert answer.status_code == 403 or "You do not have permission" in shown, (
            label,
            action,
            kind,
            shown,
        )
        assert changed == [], (label, action, kind, changed)


def test_a_staff_user_with_only_view_permissions_sees_no_usable_secret(client):
    """The issue's report: a view-only staff account issued tokens and acted from the admin."""
    world = build_world()
    viewer = user_in("viewer")
    client.force_login(viewer)
    before = fingerprint()
    for action in ("issue_enrollment_token", "drain", "revoke", "force_offline", "force_rotation"):
        answer = client.post(
            "/admin/workers/worker/",
            {"action": action, "_selected_action": [str(world.worker.worker_id)], "index": "0"},
            follow=True,
        )
        text = answer.content.decode()
        assert "qlenroll_" not in text and "You do not have permission" in text, action
    assert client.get("/admin/accounts/apitoken/").status_code == 403
    assert changed_tables(before, fingerprint()) == []
