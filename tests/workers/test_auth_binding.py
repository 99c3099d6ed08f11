"""Principal binding (ADR-0012 §1, docs/transport.md §3): identity comes only from the signature;
a body or path worker id or session id of another worker is refused before any repository
query."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from api.base import check_principal_binding
from core.errors import DomainError
from protocol import wire
from protocol.ids import uuid7
from tests.helpers import (
    OfferTicket,
    SignedClient,
    enrolled_worker,
    heartbeat,
    register,
    register_body,
    repository_queries,
)
from workers.models import WorkerSession
from workers.principals import WorkerPrincipal

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_workers(client):
    """Workers A and B, each with a live session, each having made one request (warm caches)."""
    a, b = enrolled_worker(), enrolled_worker()
    session_a, session_b = register(a), register(b)
    for worker, session in ((a, session_a), (b, session_b)):
        warm = SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat(session))
        assert warm.status_code == 200, warm.json()
    return (a, session_a), (b, session_b)


def test_worker_a_key_with_worker_b_id_is_refused_before_any_query(client, two_workers):
    (a, session_a), (b, _) = two_workers
    with CaptureQueriesContext(connection) as queries:
        answer = SignedClient(client, a).post(
            wire.SESSION_HEARTBEAT, heartbeat(session_a, workerId=str(b.worker_id))
        )
    assert answer.status_code == 403
    assert answer.json() == {
        "code": "principal_mismatch",
        "message": "workerId is not the authenticated worker",
        "field": "workerId",
    }
    assert repository_queries(queries) == []


def test_worker_a_key_with_worker_b_session_is_refused_before_any_query(client, two_workers):
    (a, _), (b, session_b) = two_workers
    before = list(WorkerSession.objects.order_by("pk").values())
    api = SignedClient(client, a)
    with CaptureQueriesContext(connection) as queries:
        answers = [
            api.post(wire.SESSION_HEARTBEAT, heartbeat(session_b)),
            api.post(wire.SESSION_DRAIN, {**session_b.fence(), "expectedVersion": session_b.version}),
            api.post(wire.SESSION_OFFLINE, {**session_b.fence(), "expectedVersion": session_b.version}),
            api.post(
                wire.CLAIM,
                {
                    **session_b.fence(),
                    "offers": [{"offerId": str(OfferTicket().offer_id), "leaseToken": OfferTicket().token}],
                },
            ),
            api.post(
                wire.LEASE_RENEW,
                {
                    **session_b.fence(),
                    "attemptId": str(uuid.uuid4()),
                    "leaseGeneration": 1,
                    "leaseToken": OfferTicket().token,
                    "leaseVersion": 0,
                },
            ),
        ]
    for answer in answers:
        assert answer.status_code == 403, answer.json()
        assert answer.json()["code"] == "principal_mismatch" and answer.json()["field"] == "sessionId"
    assert repository_queries(queries) == []
    assert list(WorkerSession.objects.order_by("pk").values()) == before


def test_another_workers_session_is_refused_with_a_cold_cache_too(client):
    a, b = enrolled_worker(), enrolled_worker()
    register(a)
    session_b = register(b)  # registered through the service: no cached owner
    answer = SignedClient(client, a).post(wire.SESSION_HEARTBEAT, heartbeat(session_b))
    assert answer.status_code == 403 and answer.json()["field"] == "sessionId"


def test_registering_over_http_binds_the_session_to_its_worker_at_once(client):
    a, b = enrolled_worker(), enrolled_worker()
    session_id = str(uuid7())
    registered = SignedClient(client, b).post(
        wire.SESSION_REGISTER,
        register_body(session_id=session_id, maxConcurrentRuns=1, availableSlots=1),
    )
    assert registered.status_code == 201, registered.json()
    api = SignedClient(client, a)
    api.post(
        wire.SESSION_HEARTBEAT,
        {"sessionId": session_id, "generation": 1, "expectedVersion": 0, "availableSlots": 1},
    )  # warms A's credential
    with CaptureQueriesContext(connection) as queries:
        answer = api.post(
            wire.SESSION_HEARTBEAT,
            {"sessionId": session_id, "generation": 1, "expectedVersion": 0, "availableSlots": 1},
        )
    assert answer.status_code == 403 and answer.json()["field"] == "sessionId"
    assert repository_queries(queries) == []


def test_own_ids_pass_and_non_ids_are_left_to_the_serializer(client, two_workers):
    (a, session_a), _ = two_workers
    api = SignedClient(client, a)
    assert (
        api.post(wire.SESSION_HEARTBEAT, heartbeat(session_a, workerId=str(a.worker_id))).status_code == 200
    )
    answer = api.post(wire.SESSION_HEARTBEAT, heartbeat(session_a, workerId="not-a-uuid"))
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "validation_failed",
        "workerId",
    )
    answer = api.post(wire.SESSION_HEARTBEAT, heartbeat(session_a, sessionId=7))
    assert (answer.status_code, answer.json()["field"]) == (400, "sessionId")


def test_path_arguments_are_bound_like_body_fields(two_workers):
    (a, session_a), (b, session_b) = two_workers
    principal = WorkerPrincipal(worker_id=a.worker_id, worker_name=a.name, credential_id=a.credential_id)
    request = APIRequestFactory().post("/", {}, format="json")

    request = Request(request, parsers=[JSONParser()])
    check_principal_binding(
        principal, request, {"worker_id": str(a.worker_id), "session_id": str(session_a.session_id)}
    )
    with pytest.raises(DomainError) as refused:
        check_principal_binding(principal, request, {"worker_id": str(b.worker_id)})
    assert (refused.value.code, refused.value.field) == ("principal_mismatch", "worker_id")
    with pytest.raises(DomainError) as refused:
        check_principal_binding(principal, request, {"session_id": str(session_b.session_id)})
    assert (refused.value.code, refused.value.field) == ("principal_mismatch", "session_id")
