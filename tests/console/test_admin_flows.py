"""Console write flows through the admin (Django's test client, real write paths): adding a
worker, creating and editing tasks as revisions, run now, retry, wording and time zones."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages

from actions.workers import worker_revoke
from audit.models import Event
from runs.models import Run, Task
from tests.console.fixtures import PASSWORD, make_user
from tests.helpers import enqueue, enrolled_worker, make_revision
from workers.models import Worker

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    make_user("operator")
    assert client.login(username="operator", password=PASSWORD)
    return client


def task_form(**changes):
    form = {
        "name": "nightly-report",
        "description": "",
        "executor": "shell",
        "command": "echo hi",
        "timeout_seconds": "60",
        "env": "",
        "placement": "",
        "max_attempts": "1",
        "lost_retry": "never",
        "retry_backoff_seconds": "10",
        "retry_backoff_max_seconds": "300",
        "_save": "Save",
    }
    return {**form, **changes}


def test_adding_a_worker_shows_its_token_and_command_once_and_never_a_500(operator):
    answer = operator.post(
        "/admin/workers/worker/add/", {"name": "build-box-1", "description": "", "_save": "Save"}
    )
    assert answer.status_code == 200
    page = answer.content.decode()
    worker = Worker.objects.get(name="build-box-1")
    assert "qinglong-worker enroll --server http://testserver --token qlenroll_" in page
    assert Event.objects.filter(kind="worker.created", worker_id=worker.pk).exists()
    assert Event.objects.filter(kind="enrollment.token_issued", worker_id=worker.pk).exists()
    refused = operator.post("/admin/workers/worker/add/", {"name": "Build Box", "_save": "Save"})
    assert refused.status_code == 200 and "errorlist" in refused.content.decode()
    taken = operator.post("/admin/workers/worker/add/", {"name": "build-box-1", "_save": "Save"})
    assert taken.status_code == 200 and "already exists" in taken.content.decode()


def test_a_task_is_created_with_field_errors_first_and_each_edit_is_a_new_revision(operator):
    bad = operator.post(
        "/admin/runs/task/add/",
        task_form(placement='{"required": {"arch": ["sparc"]}}', env="NOT A LINE", timeout_seconds="0"),
    )
    assert bad.status_code == 200 and not Task.objects.exists()
    errors = bad.context["adminform"].form.errors
    assert set(errors) >= {"timeout_seconds"}
    bad = operator.post("/admin/runs/task/add/", task_form(placement='{"required": {"arch": ["sparc"]}}'))
    assert "unknown architecture" in str(bad.context["adminform"].form.errors["placement"])
    bad = operator.post("/admin/runs/task/add/", task_form(env="1BAD=x"))
    assert "env" in bad.context["adminform"].form.errors

    assert (
        operator.post("/admin/runs/task/add/", task_form(env="API_TOKEN=hunter2\nMODE=fast")).status_code
        == 302
    )
    task = Task.objects.get(name="nightly-report")
    [r1] = task.revisions.all()
    assert r1.env == {"API_TOKEN": "hunter2", "MODE": "fast"}
    page = operator.get(f"/admin/runs/task/{task.pk}/change/").content.decode()
    assert "hunter2" not in page and "API_TOKEN=••••••" in page

    # Saving the masked value unchanged keeps the secret and writes no revision.
    same = task_form(env="API_TOKEN=••••••\nMODE=fast")
    assert operator.post(f"/admin/runs/task/{task.pk}/change/", same).status_code == 302
    assert task.revisions.count() == 1
    changed = task_form(env="API_TOKEN=••••••\nMODE=slow", command="echo bye", name="renamed")
    assert operator.post(f"/admin/runs/task/{task.pk}/change/", changed).status_code == 302
    r2 = task.revisions.order_by("-number").first()
    assert (r2.number, r2.command, r2.env) == (2, "echo bye", {"API_TOKEN": "hunter2", "MODE": "slow"})
    assert Task.objects.get(pk=task.pk).name == "nightly-report"  # never renamed
    page = operator.get(f"/admin/runs/task/{task.pk}/change/").content.decode()
    assert "+command | echo bye" in page and "-command | echo hi" in page

    # Run now, of a chosen (older) revision.
    answer = operator.post(f"/admin/runs/task/{task.pk}/run/", {"revision": str(r1.pk)})
    run = Run.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/admin/runs/run/{run.pk}/change/"
    assert run.revision_id == r1.pk and run.created_by == "operator"
    page = operator.get(answer["Location"]).content.decode()
    assert "waiting for a lease" in page and "Claimed" not in page


def test_tasks_cannot_be_deleted_in_bulk_or_one_by_one(operator, admin_client):
    task = make_revision("keep-me").task
    for who in (operator, admin_client):
        changelist = who.get("/admin/runs/task/").content.decode()
        assert "delete_selected" not in changelist
        assert who.get(f"/admin/runs/task/{task.pk}/delete/").status_code in (403, 302)
    assert Task.objects.filter(pk=task.pk).exists()


def test_retry_makes_a_new_run_of_a_finished_one_and_leaves_a_live_one(operator):
    revision = make_revision()
    live = enqueue(revision)
    finished = enqueue(revision)
    operator.post("/admin/runs/run/", {"action": "cancel", "_selected_action": [str(finished.pk)]})
    answer = operator.post(
        "/admin/runs/run/", {"action": "retry", "_selected_action": [str(live.pk), str(finished.pk)]}
    )
    texts = [str(m) for m in get_messages(answer.wsgi_request)]
    assert any("still queued, not retried" in t for t in texts)
    assert any("retried as" in t for t in texts)
    assert Run.objects.count() == 3


def test_acting_on_a_revoked_worker_says_nothing_changed(admin_client):
    worker = enrolled_worker("build-box-2")
    worker_revoke(worker_id=worker.worker_id)
    answer = admin_client.post(
        "/admin/workers/worker/", {"action": "undrain", "_selected_action": [str(worker.worker_id)]}
    )
    [message] = [str(m) for m in get_messages(answer.wsgi_request)]
    assert message == "build-box-2: nothing changed, the worker is revoked"


@pytest.mark.parametrize(("cookie", "shown"), [("Asia/Tokyo", "+9"), ("Not/AZone", "UTC"), ("../etc", "UTC")])
def test_times_show_in_the_operators_timezone_with_utc_on_hover(admin_client, cookie, shown):
    worker = enrolled_worker("tz-box")
    created = Worker.objects.get(pk=worker.worker_id).created_at
    admin_client.cookies["ql_tz"] = cookie
    page = admin_client.get("/admin/workers/worker/").content.decode()
    utc = f"{created:%Y-%m-%d %H:%M:%S} UTC"
    assert f'title="{utc}"' in page
    if shown == "+9":
        local = created + timedelta(hours=9)
        assert f">{local:%Y-%m-%d %H:%M:%S}</time>" in page
    else:
        assert f">{created:%Y-%m-%d %H:%M:%S}</time>" in page
