"""Worker authentication over HTTP: signatures, principal binding (ADR-0012 §1)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection
from django.test.utils import CaptureQueriesContext

from protocol import wire
from protocol.ids import uuid7
from tests.helpers import BASE_SNAPSHOT, SignedClient, enrolled_worker, register, repository_queries

pytestmark = pytest.mark.django_db


def heartbeat_body(session, **changes):
    return {**session.fence(), "expectedVersion": session.version, "availableSlots": 1, **changes}


def test_unsigned_request_is_refused(client):
    worker = enrolled_worker()
    session = register(worker)
    answer = client.post(wire.SESSION_HEARTBEAT, heartbeat_body(session), content_type="application/json")
    assert answer.status_code == 401
    assert answer.json()["code"] == "signature_missing"
    assert "Signature" in answer["WWW-Authenticate"]


def test_request_signed_with_another_key_is_refused(client):
    worker = enrolled_worker()
    session = register(worker)
    answer = SignedClient(client, worker).post(
        wire.SESSION_HEARTBEAT, heartbeat_body(session), key=Ed25519PrivateKey.generate()
    )
    assert answer.status_code == 401 and answer.json()["code"] == "signature_invalid"


def test_body_worker_id_of_another_worker_is_refused_before_any_query(client):
    worker, other = enrolled_worker(), enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    warm = api.post(wire.SESSION_HEARTBEAT, heartbeat_body(session, workerId=str(worker.worker_id)))
    assert warm.status_code == 200, warm.json()  # also warms the credential cache
    with CaptureQueriesContext(connection) as queries:
        answer = api.post(wire.SESSION_HEARTBEAT, heartbeat_body(session, workerId=str(other.worker_id)))
    assert answer.status_code == 403
    assert answer.json() == {
        "code": "principal_mismatch",
        "message": "workerId is not the authenticated worker",
        "field": "workerId",
    }
    assert repository_queries(queries) == []


def test_generation_1_heartbeat_after_restart_is_fenced_over_http(client):
    worker = enrolled_worker()
    first = register(worker)
    second = register(worker)
    assert second.generation == 2
    answer = SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat_body(first))
    assert answer.status_code == 409 and answer.json()["code"] == "session_superseded"


def test_unknown_fields_are_refused_with_the_field_named(client):
    worker = enrolled_worker()
    session = register(worker)
    answer = SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat_body(session, extra=1))
    assert answer.status_code == 400
    assert answer.json()["code"] == "validation_failed" and answer.json()["field"] == "extra"


def test_text_is_taken_as_sent_so_a_trailing_newline_is_refused_not_trimmed(client):
    worker = enrolled_worker()
    body = {
        "sessionId": str(uuid7()),
        "capabilities": BASE_SNAPSHOT,
        "maxConcurrentRuns": 1,
        "availableSlots": 1,
        "softwareVersion": "ab\n",
        "protocolVersion": 1,
    }
    answer = SignedClient(client, worker).post(wire.SESSION_REGISTER, body)
    assert (answer.status_code, answer.json()["field"]) == (400, "softwareVersion")
