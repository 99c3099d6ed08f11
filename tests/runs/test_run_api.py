"""The operator API for runs: create a task with a retry policy, enqueue, cancel, read — and
every bad input is a 4xx that names its field."""

from __future__ import annotations

import uuid

import pytest

from runs.models import Run, RunAttempt
from tests.helpers import api_token, enqueue, enrolled_worker, make_revision, operator_user, register
from tests.leases.flows import claim_one, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(client):
    token = api_token(operator_user("op", role="admin"))

    def post(path, body):
        return client.post(path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}")

    def get(path):
        return client.get(path, HTTP_AUTHORIZATION=f"Token {token}")

    post.get = get
    return post


TASK = {
    "name": "nightly",
    "executor": "shell",
    "command": "true",
    "timeoutSeconds": 60,
    "retry": {
        "maxAttempts": 3,
        "retryOn": ["failed"],
        "lostRetry": "idempotent",
        "backoffSeconds": 5,
        "backoffMaxSeconds": 60,
    },
}


def test_create_enqueue_read_and_cancel(ops):
    created = ops("/api/v1/ops/tasks", TASK)
    assert created.status_code == 201, created.json()
    assert created.json()["maxAttempts"] == 3
    queued = ops("/api/v1/ops/runs", {"task": "nightly", "priority": 5})
    assert queued.status_code == 201, queued.json()
    body = queued.json()
    assert (
        body["state"] == "queued" and body["attemptCount"] == 1 and body["attempts"][0]["state"] == "claimed"
    )
    cancelled = ops(f"/api/v1/ops/runs/{body['id']}/cancel", {"reason": "changed my mind"})
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "requested" and cancelled.json()["run"]["state"] == "cancelled"
    again = ops(f"/api/v1/ops/runs/{body['id']}/cancel", {})
    assert again.json()["status"] == "already_terminal"
    read = ops.get(f"/api/v1/ops/runs/{body['id']}")
    assert read.status_code == 200 and read.json()["cancelReason"] == "changed my mind"


def test_cancel_of_a_running_run_is_recorded_and_the_run_keeps_running_until_the_worker_stops(ops):
    session = register(enrolled_worker())
    run = enqueue(make_revision())
    start(claim_one(session))
    answer = ops(f"/api/v1/ops/runs/{run.pk}/cancel", {})
    assert answer.status_code == 202
    assert answer.json()["status"] == "requested"
    assert answer.json()["run"]["state"] == "running" and answer.json()["run"]["cancelRequestedAt"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/ops/tasks", {**TASK, "retry": {**TASK["retry"], "maxAttempts": 0}}, "retry.maxAttempts"),
        ("/api/v1/ops/tasks", {**TASK, "retry": {**TASK["retry"], "maxAttempts": 21}}, "retry.maxAttempts"),
        (
            "/api/v1/ops/tasks",
            {**TASK, "retry": {**TASK["retry"], "retryOn": ["succeeded"]}},
            "retry.retryOn[0]",
        ),
        ("/api/v1/ops/tasks", {**TASK, "retry": {**TASK["retry"], "lostRetry": "always"}}, "retry.lostRetry"),
        (
            "/api/v1/ops/tasks",
            {**TASK, "retry": {**TASK["retry"], "backoffSeconds": 0}},
            "retry.backoffSeconds",
        ),
        (
            "/api/v1/ops/tasks",
            {**TASK, "retry": {**TASK["retry"], "backoffMaxSeconds": 1}},
            "retry.backoffMaxSeconds",
        ),
        ("/api/v1/ops/tasks", {**TASK, "retry": {**TASK["retry"], "surprise": 1}}, "retry.surprise"),
        ("/api/v1/ops/runs", {"task": "nightly", "priority": 101}, "priority"),
        ("/api/v1/ops/runs", {"task": "nightly", "priority": "1"}, "priority"),
        ("/api/v1/ops/runs", {"task": "nightly", "revisionId": str(uuid.uuid4())}, "task"),
        ("/api/v1/ops/runs", {"task": "no-such-task"}, "task"),
        ("/api/v1/ops/runs", {"revisionId": str(uuid.uuid4())}, "revisionId"),
        ("/api/v1/ops/runs", {"revisionId": "nope"}, "revisionId"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(ops, path, body, field):
    if path.endswith("/runs"):
        assert ops("/api/v1/ops/tasks", TASK).status_code == 201
    answer = ops(path, body)
    assert 400 <= answer.status_code < 500, answer.content
    assert answer.json()["field"] == field, answer.json()
    assert not Run.objects.exists()


def test_cancel_refuses_bad_input_naming_the_field(ops):
    run = enqueue(make_revision())
    answer = ops(f"/api/v1/ops/runs/{run.pk}/cancel", {"reason": "x" * 201})
    assert answer.status_code == 400 and answer.json()["field"] == "reason"
    answer = ops(f"/api/v1/ops/runs/{run.pk}/cancel", {"why": "unknown field"})
    assert answer.status_code == 400 and answer.json()["field"] == "why"
    missing = ops(f"/api/v1/ops/runs/{uuid.uuid4()}/cancel", {})
    assert missing.status_code == 404 and missing.json()["code"] == "run_not_found"
    assert RunAttempt.objects.get(run=run).state == "claimed"
