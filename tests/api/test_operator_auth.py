"""Operator API authentication: an API token or a console session, then the role's permission
(no staff check); a worker credential never gets in, and operator credentials do not open the
worker API either."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import ApiToken
from protocol import wire
from protocol.signing import sign_request
from tests.helpers import SignedClient, api_token, enrolled_worker, operator_user, register

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/ops/runs"


def token_for(username: str, *, role: str = "admin") -> str:
    return api_token(operator_user(username, role=role), role=role)


def test_anonymous_callers_are_asked_to_authenticate(client):
    answer = client.get(RUNS)
    assert (answer.status_code, answer.json()["code"]) == (401, "not_authenticated")
    assert answer["WWW-Authenticate"].startswith("Token")


def test_an_admin_token_reads_and_writes(client):
    headers = {"Authorization": f"Token {token_for('ops')}"}
    assert client.get(RUNS, headers=headers).status_code == 200
    created = client.post(
        "/api/v1/ops/tasks",
        {"name": "nightly", "executor": "shell", "command": "true", "timeoutSeconds": 10},
        content_type="application/json",
        headers=headers,
    )
    assert created.status_code == 201, created.json()


def test_a_token_of_a_user_without_a_role_is_forbidden_even_for_staff(client):
    nobody = operator_user("staff-only", staff=True)
    answer = client.get(
        RUNS, headers={"Authorization": f"Token {api_token(nobody, role='viewer', check=False)}"}
    )
    assert (answer.status_code, answer.json()["code"]) == (403, "permission_denied")
    assert "runs.view_run" in answer.json()["message"]


def test_a_viewer_token_of_a_superuser_is_held_to_the_viewer_role(client):
    root = operator_user("root", superuser=True)
    headers = {"Authorization": f"Token {api_token(root, role='viewer')}"}
    assert client.get(RUNS, headers=headers).status_code == 200
    answer = client.post(RUNS, {"task": "x"}, content_type="application/json", headers=headers)
    assert (answer.status_code, answer.json()["code"]) == (403, "permission_denied")
    assert "role viewer" in answer.json()["message"]


def test_an_expired_token_is_refused_and_not_deleted(client):
    token = token_for("late")
    ApiToken.objects.update(expiry=timezone.now())
    answer = client.get(RUNS, headers={"Authorization": f"Token {token}"})
    assert (answer.status_code, answer.json()["code"]) == (401, "not_authenticated")
    assert ApiToken.objects.count() == 1


def test_a_token_is_stored_only_as_a_digest(client):
    token = token_for("digest")
    row = ApiToken.objects.values().get()
    assert token not in str(row)
    assert token.startswith("qlops_") and len(token) == 6 + 64


@pytest.mark.parametrize("value", ["Token not-a-real-token", "Token qlops_\xff\xfe", "Token", "Token a b"])
def test_a_bad_token_is_refused(client, value):
    answer = client.get(RUNS, headers={"Authorization": value})
    assert (answer.status_code, answer.json()["code"]) == (401, "not_authenticated")


def test_a_session_reads_and_needs_csrf_to_write(client):
    staff = operator_user("desk", role="operator")
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
    staff_token = token_for("ops2")

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
    headers = {"Authorization": f"Token {token_for('ops3')}"}
    answer = client.post(wire.SESSION_HEARTBEAT, body, content_type="application/json", headers=headers)
    assert (answer.status_code, answer.json()["code"]) == (401, "signature_missing")
    staff = get_user_model().objects.get(username="ops3")
    client.force_login(staff)
    answer = client.post(wire.SESSION_HEARTBEAT, body, content_type="application/json")
    assert (answer.status_code, answer.json()["code"]) == (401, "signature_missing")
    assert SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, body).status_code == 200
