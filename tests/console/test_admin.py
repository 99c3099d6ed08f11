"""Every admin action refuses a malformed selection with a message and does nothing (a 500 is a
bug, in the admin too)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from audit.models import Event
from runs.models import Run
from tests.helpers import enqueue, make_revision
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
