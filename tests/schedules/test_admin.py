"""Schedules in the admin: saves go through the write paths (validated, audited), the form shows
the live preview and the next fire times, and each act needs its model permission."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from audit.models import Event
from schedules.models import Schedule
from tests.helpers import make_revision
from tests.schedules.flows import make_schedule

pytestmark = pytest.mark.django_db
ADD = "/admin/schedules/schedule/add/"


def form(revision, **overrides):
    data = {
        "task": str(revision.task_id),
        "description": "nightly report",
        "cron": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "enabled": "on",
        "start_at_0": "",
        "start_at_1": "",
        "end_at_0": "",
        "end_at_1": "",
        "overlap": "skip",
        "misfire": "run_once",
        "misfire_grace_seconds": "300",
        "jitter_seconds": "0",
        "priority": "0",
        "expected_version": "",
    }
    return {**data, **overrides}


@pytest.fixture
def admin_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="correct horse battery"))
    return client


def test_adding_a_schedule_in_the_admin_goes_through_the_write_path(admin_client):
    revision = make_revision()
    answer = admin_client.post(ADD, form(revision))
    assert answer.status_code == 302, answer.context["adminform"].form.errors if answer.context else answer
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.timezone, schedule.next_fire_at is not None) == (
        "30 2 * * *",
        "Europe/Berlin",
        True,
    )
    event = Event.objects.get(kind="schedule.created")
    assert (event.actor_type, event.actor) == ("operator", "root")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"cron": "99 * * * *"}, "cron"), ({"cron": "* * *"}, "cron"), ({"timezone": "Mars/Base"}, "timezone")],
)
def test_the_admin_form_names_the_bad_field(admin_client, overrides, field):
    answer = admin_client.post(ADD, form(make_revision(), **overrides))
    assert answer.status_code == 200
    assert field in answer.context["adminform"].form.errors
    assert not Schedule.objects.exists()


def test_the_change_form_offers_the_preview_and_lists_next_fires(admin_client):
    schedule = make_schedule(make_revision(), "0 * * * *", timezone="Asia/Shanghai")
    page = admin_client.get(f"/admin/schedules/schedule/{schedule.pk}/change/")
    text = page.content.decode()
    assert page.status_code == 200
    assert 'id="schedule-preview"' in text and "/api/v1/ops/schedules/preview" in text
    assert "console/schedule_preview.js" in text
    assert text.count("+08:00</li>") == 5
    # The preview the form's script calls answers the admin's own session.
    preview = admin_client.get(
        "/api/v1/ops/schedules/preview", {"cron": "0 * * * *", "timezone": "Asia/Shanghai"}
    )
    assert preview.status_code == 200


def test_changing_and_deleting_in_the_admin_are_audited(admin_client):
    revision = make_revision()
    schedule = make_schedule(revision, "0 * * * *")
    path = f"/admin/schedules/schedule/{schedule.pk}/change/"
    answer = admin_client.post(path, form(revision, cron="15 * * * *", expected_version="0"))
    assert answer.status_code == 302
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.version, schedule.next_fire_at.minute) == ("15 * * * *", 1, 15)
    stale = admin_client.post(path, form(revision, cron="45 * * * *", expected_version="0"))
    assert stale.status_code == 200 and Schedule.objects.get().cron == "15 * * * *"
    answer = admin_client.post(f"/admin/schedules/schedule/{schedule.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302
    assert not Schedule.objects.exists()
    assert [e.kind for e in Event.objects.filter(kind__startswith="schedule.").order_by("id")] == [
        "schedule.created",
        "schedule.changed",
        "schedule.deleted",
    ]


def test_staff_need_the_model_permission_for_each_act(client):
    revision = make_revision()
    staff = get_user_model().objects.create_user("desk", password="correct horse battery", is_staff=True)
    client.force_login(staff)
    assert client.get(ADD).status_code == 403
    assert client.post(ADD, form(revision)).status_code == 403
    schedule = make_schedule(revision)
    assert client.get(f"/admin/schedules/schedule/{schedule.pk}/change/").status_code == 403

    staff.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    page = client.get(f"/admin/schedules/schedule/{schedule.pk}/change/")
    assert page.status_code == 200
    assert (
        client.post(
            f"/admin/schedules/schedule/{schedule.pk}/change/", form(revision, cron="5 * * * *")
        ).status_code
        == 403
    )
    assert client.post(f"/admin/schedules/schedule/{schedule.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Schedule.objects.get().cron == "* * * * *"

    staff.user_permissions.add(Permission.objects.get(codename="add_schedule"))
    staff = get_user_model().objects.get(pk=staff.pk)  # permission cache
    client.force_login(staff)
    assert client.post(ADD, form(revision)).status_code == 302
    assert Schedule.objects.count() == 2


def test_the_list_shows_next_fire_and_last_run(admin_client):
    make_schedule(make_revision(), "30 2 * * *", timezone="Asia/Shanghai")
    page = admin_client.get("/admin/schedules/schedule/")
    assert page.status_code == 200
    assert "02:30:00+08:00" in page.content.decode()
