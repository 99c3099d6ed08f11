"""The schedule API: preview (ISO 8601 with offsets, 400 naming the field), create/read/change/
delete under the Schedule model permissions, audited."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from audit.models import Event
from schedules.models import Schedule
from tests.helpers import api_token, make_revision

pytestmark = pytest.mark.django_db
PREVIEW = "/api/v1/ops/schedules/preview"
SCHEDULES = "/api/v1/ops/schedules"


def operator(client, username="op", *, superuser=True, perms=()):
    user = get_user_model().objects.create_user(username, is_staff=True, is_superuser=superuser)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(codename=codename, content_type__app_label="schedules")
        )
    headers = {"Authorization": f"Token {api_token(user, role='admin', check=False)}"}

    class Caller:
        def get(self, path, params=None):
            return client.get(path, params or {}, headers=headers)

        def post(self, path, body):
            return client.post(path, body, content_type="application/json", headers=headers)

        def patch(self, path, body):
            return client.patch(path, body, content_type="application/json", headers=headers)

        def delete(self, path):
            return client.delete(path, headers=headers)

    return Caller()


def test_preview_lists_berlin_fires_across_spring_forward_with_their_offsets(client):
    answer = operator(client).get(
        PREVIEW,
        {"cron": "30 2 * * *", "timezone": "Europe/Berlin", "count": "3", "after": "2026-03-28T00:00:00Z"},
    )
    assert answer.status_code == 200, answer.json()
    assert answer.json()["fireTimes"] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    assert answer.json()["explanation"] == "At 02:30 every day"


def test_preview_lists_new_york_hours_across_fall_back(client):
    answer = operator(client).get(
        PREVIEW,
        {
            "cron": "0 * * * *",
            "timezone": "America/New_York",
            "count": "3",
            "after": "2026-11-01T04:30:00+00:00",
        },
    )
    assert answer.json()["fireTimes"] == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ]


def test_preview_reads_an_unencoded_plus_as_the_offset_sign(client):
    answer = operator(client).get(
        PREVIEW + "?cron=0+*+*+*+*&timezone=Asia/Shanghai&count=1&after=2026-01-01T00:30:00+08:00"
    )
    assert answer.status_code == 200, answer.json()
    assert answer.json()["fireTimes"] == ["2026-01-01T01:00:00+08:00"]


def test_preview_defaults_to_ten_fires_after_now_in_utc(client):
    answer = operator(client).get(PREVIEW, {"cron": "*/5 * * * *"})
    body = answer.json()
    assert (answer.status_code, body["timezone"], len(body["fireTimes"])) == (200, "UTC", 10)
    assert all(t.endswith("+00:00") for t in body["fireTimes"])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"cron": "99 * * * *"}, "cron"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Base"}, "timezone"),
        ({"cron": "* * * * *", "timezone": ""}, "timezone"),
        ({"cron": "* * * * *", "after": "yesterday"}, "after"),
        ({"cron": "* * * * *", "after": "2026-01-01T00:00:00"}, "after"),  # no offset
        ({"cron": "* * * * *", "after": "9999-12-31T23:59:59Z"}, "after"),
        ({"cron": "* * * * *", "count": "0"}, "count"),
        ({"cron": "* * * * *", "count": "101"}, "count"),
        ({"cron": "* * * * *", "count": "ten"}, "count"),
    ],
)
def test_preview_refuses_bad_input_with_a_400_naming_the_field(client, params, field):
    answer = operator(client).get(PREVIEW, params)
    assert answer.status_code == 400
    assert (answer.json()["code"], answer.json()["field"]) == ("validation_failed", field)


def test_create_read_change_delete_a_schedule_audited(client):
    make_revision("nightly")
    ops = operator(client)
    created = ops.post(
        SCHEDULES,
        {
            "task": "nightly",
            "cron": "30 2 * * *",
            "timezone": "Asia/Shanghai",
            "overlap": "queue_one",
            "jitterSeconds": 30,
        },
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["taskName"], body["cron"], body["overlap"], body["misfire"], body["version"]) == (
        "nightly",
        "30 2 * * *",
        "queue_one",
        "run_once",
        0,
    )
    assert body["nextFireAt"].endswith("T02:30:00+08:00")
    assert len(body["nextFireTimes"]) == 5 and body["nextFireTimes"][0] == body["nextFireAt"]
    assert (body["lastFireAt"], body["lastRun"], body["recentFires"]) == (None, None, [])
    assert 0 <= body["jitterOffsetSeconds"] <= 30

    path = f"{SCHEDULES}/{body['id']}"
    assert ops.get(path).json()["id"] == body["id"]
    assert [s["id"] for s in ops.get(SCHEDULES, {"task": "nightly"}).json()] == [body["id"]]

    changed = ops.patch(path, {"cron": "0 3 * * 1-5", "expectedVersion": 0})
    assert changed.status_code == 200, changed.json()
    assert (changed.json()["cron"], changed.json()["version"], changed.json()["overlap"]) == (
        "0 3 * * 1-5",
        1,
        "queue_one",
    )
    stale = ops.patch(path, {"enabled": False, "expectedVersion": 0})
    assert (stale.status_code, stale.json()["code"], stale.json()["details"]) == (
        409,
        "schedule_version_conflict",
        {"version": 1},
    )
    disabled = ops.patch(path, {"enabled": False})
    assert (disabled.json()["nextFireAt"], disabled.json()["nextFireTimes"]) == (None, [])

    # Like a task, a schedule is disabled rather than deleted: an admin-role token may not delete
    # one; a superuser (here by console session) may.
    assert ops.delete(path).status_code == 403
    client.force_login(get_user_model().objects.get(username="op"))
    assert client.delete(path).status_code == 204
    assert ops.get(path).status_code == 404
    kinds = list(
        Event.objects.filter(kind__startswith="schedule.").order_by("id").values_list("kind", "actor_type")
    )
    assert kinds == [
        ("schedule.created", "api_app"),
        ("schedule.changed", "api_app"),
        ("schedule.changed", "api_app"),
        ("schedule.deleted", "api_app"),
    ]
    assert Event.objects.filter(kind="schedule.changed").order_by("id").first().data["changed"] == {"cron": 1}


@pytest.mark.parametrize(
    ("body", "field", "status"),
    [
        ({"cron": "* * * * *"}, "task", 400),
        ({"task": "nightly"}, "cron", 400),
        ({"task": "nightly", "cron": "bad"}, "cron", 400),
        ({"task": "nightly", "cron": "* * * * *", "timezone": "Nowhere/City"}, "timezone", 400),
        ({"task": "nightly", "cron": "* * * * *", "overlap": "sometimes"}, "overlap", 400),
        ({"task": "nightly", "cron": "* * * * *", "misfire": "catch_all"}, "misfire", 400),
        ({"task": "nightly", "cron": "* * * * *", "misfireGraceSeconds": -1}, "misfireGraceSeconds", 400),
        ({"task": "nightly", "cron": "* * * * *", "jitterSeconds": 3601}, "jitterSeconds", 400),
        ({"task": "nightly", "cron": "* * * * *", "jitterSeconds": "5"}, "jitterSeconds", 400),
        ({"task": "nightly", "cron": "* * * * *", "startAt": "2026-01-01"}, "startAt", 400),
        (
            {
                "task": "nightly",
                "cron": "* * * * *",
                "startAt": "2026-02-01T00:00:00Z",
                "endAt": "2026-01-01T00:00:00Z",
            },
            "endAt",
            400,
        ),
        ({"task": "nightly", "cron": "* * * * *", "enabled": "yes"}, "enabled", 400),
        ({"task": "nightly", "cron": "* * * * *", "colour": "blue"}, "colour", 400),
        ({"task": "nobody", "cron": "* * * * *"}, "task", 404),
    ],
)
def test_create_refuses_bad_input_naming_the_field(client, body, field, status):
    make_revision("nightly")
    answer = operator(client).post(SCHEDULES, body)
    assert answer.status_code == status, answer.json()
    assert answer.json()["field"] == field
    assert not Schedule.objects.exists()


def test_unknown_schedule_is_404(client):
    ops = operator(client)
    assert ops.get(f"{SCHEDULES}/{uuid.uuid4()}").json()["code"] == "schedule_not_found"
    assert ops.patch(f"{SCHEDULES}/{uuid.uuid4()}", {"enabled": False}).status_code == 404


def test_each_act_needs_its_model_permission(client):
    make_revision("nightly")
    viewer = operator(client, "viewer", superuser=False, perms=["view_schedule"])
    assert viewer.get(SCHEDULES).status_code == 200
    refused = viewer.post(SCHEDULES, {"task": "nightly", "cron": "* * * * *"})
    assert (refused.status_code, refused.json()["code"]) == (403, "permission_denied")
    assert not Schedule.objects.exists()

    nobody = operator(client, "nobody", superuser=False)
    assert nobody.get(SCHEDULES).status_code == 403

    adder = operator(client, "adder", superuser=False, perms=["add_schedule", "view_schedule"])
    created = adder.post(SCHEDULES, {"task": "nightly", "cron": "* * * * *"})
    assert created.status_code == 201
    path = f"{SCHEDULES}/{created.json()['id']}"
    assert adder.patch(path, {"enabled": False}).status_code == 403
    assert adder.delete(path).status_code == 403
    changer = operator(client, "changer", superuser=False, perms=["change_schedule"])
    assert changer.patch(path, {"enabled": False}).status_code == 200
    assert Schedule.objects.get().enabled is False


def test_a_token_acts_with_no_more_than_its_role(client):
    """Roles decide, not the staff flag (``docs/operators.md``): a viewer-scoped token of a user
    who may add schedules reads them but cannot create one."""
    user = get_user_model().objects.create_user("outsider", is_staff=False)
    for codename in ("view_schedule", "add_schedule"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    headers = {"Authorization": f"Token {api_token(user, role='viewer', check=False)}"}
    assert client.get(SCHEDULES, headers=headers).status_code == 200
    answer = client.post(
        SCHEDULES, {"task": "x", "cron": "* * * * *"}, content_type="application/json", headers=headers
    )
    assert answer.status_code == 403
