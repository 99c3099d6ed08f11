"""Every admin action refuses a malformed selection with a message and does nothing (a 500 is a
bug, in the admin too)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.db import connection

from audit.models import Event
from runs.models import Run
from tests.helpers import enqueue, make_revision, operator_user
from workers.models import Worker

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("changelist", "action"),
    [
        ("/admin/runs/run/", "cancel"),
        ("/admin/runs/task/", "run_now"),
        ("/admin/workers/worker/", "revoke"),
        ("/admin/workers/worker/", "issue_enrollment_token"),
    ],
)
def test_an_action_on_a_malformed_id_is_refused_with_a_message(admin_client, changelist, action):
    run = enqueue(make_revision())
    events = Event.objects.count()
    answer = admin_client.post(
        changelist, {"action": action, "index": 0, "_selected_action": [str(run.pk), "not-a-uuid"]}
    )
    assert answer.status_code == 302
    [message] = list(get_messages(answer.wsgi_request))
    assert "'not-a-uuid' is not a valid" in str(message)
    assert Event.objects.count() == events  # nothing was done, not even to the valid id
    assert Run.objects.get(pk=run.pk).cancel_requested_at is None
    assert not Worker.objects.exists()


def test_admin_pages_use_the_console_frame_from_templates(admin_client):
    """templates/admin/base_site.html (TEMPLATES["DIRS"]) frames every admin page."""
    page = admin_client.get("/admin/").content.decode()
    assert "| QingLong control plane</title>" in page
    assert '<div id="site-name"><a href="/admin/">QingLong control plane</a></div>' in page


def test_an_admin_adds_a_worker_through_the_write_path_and_an_operator_cannot(client):
    client.force_login(operator_user("boss", role="admin"))
    answer = client.post("/admin/workers/worker/add/", {"name": "rack-7", "description": "second rack"})
    # The console answers the add with the enrollment page: the token and command, shown once.
    assert answer.status_code == 200 and "qinglong-worker enroll" in answer.content.decode()
    created = Event.objects.get(kind="worker.created")
    assert (created.actor, created.data) == ("boss", {"role": "admin"})
    client.force_login(operator_user("ops", role="operator"))
    assert client.post("/admin/workers/worker/add/", {"name": "rack-8"}).status_code == 403
    assert list(Worker.objects.values_list("name", flat=True)) == ["rack-7"]


@pytest.mark.parametrize(
    ("changelist", "query"),
    [
        ("runs/run", "created_at__year=-1"),
        ("runs/run", "created_at__year=99999999999999999999"),
        ("workers/worker", "created_at__year=99999999999999999999"),
        ("audit/event", "created_at__year=99999999999999999999"),
        ("audit/event", "id__in=99999999999999999999"),
    ],
)
def test_a_filter_value_the_database_cannot_take_is_a_bad_lookup_not_a_500(admin_client, changelist, query):
    """A year out of range or an id beyond 64 bits passes Django's parameter checks and failed
    when the list counted its rows (a 500 a viewer could provoke); it is Django's "bad lookup"
    redirect now — or, where the store takes the value (PostgreSQL compares a 20-digit id as a
    number), the list with no row."""
    answer = admin_client.get(f"/admin/{changelist}/?{query}")
    if answer.status_code == 200:
        assert connection.vendor == "postgresql" and query.startswith("id__in"), answer.status_code
        return
    assert (answer.status_code, answer["Location"]) == (302, f"/admin/{changelist}/?e=1")
