"""Operator API authentication: staff token or session only; a worker credential never gets in,
and operator credentials do not open the worker API either."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from protocol import wire
from protocol.signing import sign_request
from tests.helpers import SignedClient, enrolled_worker, register

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/ops/runs"


def token_for(username: str, *, staff: bool) -> str:
    user = get_user_model().objects.create_user(username, password="correct horse battery", is_staff=staff)
    return Token.objects.create(user=user).key


def test_anonymous_callers_are_asked_to_authenticate(client):
    answer = client.get(RUNS)
    assert (answer.status_code, answer.json()["code"]) == (401, "not_authenticated")
    assert answer["WWW-Authenticate"].startswith("Token")


def test_a_staff_token_reads_and_writes(client):
    headers = {"Authorization": f"Token {token_for('ops', staff=True)}"}
    assert client.get(RUNS, headers=headers).status_code == 200
    created = client.post(
        "/api/v1/ops/tasks",
        {"name": "nightly", "executor": "shell", "command": "true", "timeoutSeconds": 10},
        content_type="application/json",
        headers=headers,
    )
    assert created.status_code == 201, created.json()


def test_a_non_staff_token_is_forbidden(client):
    answer = client.get(RUNS, headers={"Authorization": f"Token {token_for('viewer', staff=False)}"})
    assert (answer.status_code, answer.json()["code"]) == (403, "permission_denied")


def test_a_bad_token_is_refused(client):
    answer = client.get(RUNS, headers={"Authorization": "Token not-a-real-token"})
    assert (answer.status_code, answer.json()["code"]) == (401, "not_authenticated")


def test_a_staff_session_reads_and_needs_csrf_to_write(client):
    staff = get_user_model().objects.create_user("desk", password="correct horse battery", is_staff=True)
    client.force_login(staff)
    assert client.get(RUNS).status_code == 200
    csrf_client = type(client)(enforce_csrf_checks=True)
    csrf_client.force_login(staff)
    refused = csrf_client.post(RUNS, {"task": "x"}, content_type="application/json")
    assert (refused.status_code, refused.json()["code"]) == (403, "permission_denied")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", RUNS),
        ("POST", RUNS),
        ("POST", "/api/v1/ops/tasks"),
        ("GET", "/api/v1/ops/runs/01900000-0000-7000-8000-000000000000"),
    ],
)
def test_a_worker_signature_never_reaches_an_operator_endpoint(client, method, path):
    worker = enrolled_worker()
    staff_token = token_for("ops2", staff=True)

    headers = sign_request(
        method=method,
        path=path,
        body=b"{}" if method == "POST" else b"",
        key_id=worker.credential_id,
        private_key=worker.key,
    )
    for extra in ({}, {"Authorization": f"Token {staff_token}"}):  # not even next to a staff token
        answer = client.generic(
            method,
            path,
            b"{}" if method == "POST" else b"",
            content_type="application/json",
            headers={**headers, **extra},
        )
        assert (answer.status_code, answer.json()["code"]) == (403, "worker_credential_forbidden")


def test_operator_credentials_do_not_open_the_worker_api(client):
    worker = enrolled_worker()
    session = register(worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    headers = {"Authorization": f"Token {token_for('ops3', staff=True)}"}
    answer = client.post(wire.SESSION_HEARTBEAT, body, content_type="application/json", headers=headers)
    assert (answer.status_code, answer.json()["code"]) == (401, "signature_missing")
    staff = get_user_model().objects.get(username="ops3")
    client.force_login(staff)
    answer = client.post(wire.SESSION_HEARTBEAT, body, content_type="application/json")
    assert (answer.status_code, answer.json()["code"]) == (401, "signature_missing")
    assert SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, body).status_code == 200
