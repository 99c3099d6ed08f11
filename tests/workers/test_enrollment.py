"""Enrollment (ADR-0012 §1, §2 takeover rule): single-use, expiring tokens scoped to one worker,
stored as digests, refusals audited, re-enrollment kills the previous credentials."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.utils import timezone

from actions.enrollment import enrollment_token_create, worker_create, worker_enroll
from actions.leases.claims import OfferRequest, lease_claim
from actions.workers import worker_revoke
from audit.models import Event
from core.errors import DomainError
from leases.models import RunDispatchLease
from protocol import wire
from protocol.signing import public_key_text
from tests.helpers import (
    Enrolled,
    OfferTicket,
    SignedClient,
    enqueue,
    enrolled_worker,
    make_revision,
    register,
)
from workers.credentials import token_digest
from workers.models import CredentialState, EnrollmentToken, WorkerCredential, WorkerSession

pytestmark = pytest.mark.django_db


def new_key_text() -> tuple[Ed25519PrivateKey, str]:
    key = Ed25519PrivateKey.generate()
    return key, public_key_text(key.public_key())


def enroll(client, token: str, public_key: str | None = None, *, address: str = "203.0.113.5", **extra):
    body = {"token": token, "publicKey": new_key_text()[1] if public_key is None else public_key, **extra}
    return client.post(wire.ENROLL, body, content_type="application/json", REMOTE_ADDR=address)


def refusals(code: str) -> int:
    return Event.objects.filter(kind="enrollment.refused", data__code=code).count()


@pytest.fixture
def issued():
    worker = worker_create(name="edge-1")
    return worker, enrollment_token_create(worker_id=worker.pk)


def test_a_token_enrolls_once_and_is_kept_only_as_a_digest(client, issued):
    worker, token = issued
    assert token.token.startswith("qlenroll_") and len(token.token) > 40
    answer = enroll(client, token.token, workerName="edge-1")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["workerId"] == str(worker.pk) and answer.json()["workerName"] == "edge-1"
    credential = WorkerCredential.objects.get(pk=answer.json()["credentialId"])
    assert credential.state == CredentialState.ACTIVE and credential.worker_id == worker.pk
    stored = EnrollmentToken.objects.get(pk=token.record.pk)
    assert stored.used_by_credential == credential.pk and stored.used_at is not None
    assert token.token not in str(list(EnrollmentToken.objects.values()))
    assert Event.objects.filter(kind="worker.enrolled", worker_id=worker.pk, actor="203.0.113.5").count() == 1


def test_a_second_use_of_a_token_is_refused_and_audited(client, issued):
    _, token = issued
    assert enroll(client, token.token).status_code == 201
    credentials = list(WorkerCredential.objects.values())
    again = enroll(client, token.token)
    assert again.status_code == 401
    assert again.json() == {
        "code": "enrollment_token_used",
        "message": "the enrollment token was already used",
        "field": "token",
    }
    assert list(WorkerCredential.objects.values()) == credentials
    assert refusals("enrollment_token_used") == 1


def test_an_expired_token_is_refused_and_audited(client, issued):
    _, token = issued
    EnrollmentToken.objects.filter(pk=token.record.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    answer = enroll(client, token.token)
    assert (answer.status_code, answer.json()["code"]) == (401, "enrollment_token_expired")
    assert not WorkerCredential.objects.exists()
    assert refusals("enrollment_token_expired") == 1


def test_a_token_for_another_worker_is_refused_and_audited(client, issued):
    worker_create(name="edge-2")
    _, token = issued
    answer = enroll(client, token.token, workerName="edge-2")
    assert (answer.status_code, answer.json()["code"]) == (401, "enrollment_token_invalid")
    assert not WorkerCredential.objects.exists()
    assert refusals("enrollment_token_invalid") == 1
    assert enroll(client, token.token, workerName="edge-1").status_code == 201  # not consumed by the refusal


def test_an_unknown_token_is_refused_and_audited(client):
    answer = enroll(client, "qlenroll_" + "x" * 43)
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        401,
        "enrollment_token_invalid",
        "token",
    )
    event = Event.objects.get(kind="enrollment.refused")
    assert event.worker_id is None and event.actor == "203.0.113.5"


@pytest.mark.parametrize("public_key", ["", "abc", "A" * 44, "A" * 42 + "!"])
def test_a_malformed_public_key_is_refused_by_field_and_spends_no_token(client, issued, public_key):
    _, token = issued
    answer = enroll(client, token.token, public_key)
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "validation_failed",
        "publicKey",
    )
    assert enroll(client, token.token).status_code == 201


def test_re_enrolling_invalidates_the_previous_credentials_at_once(
    client, django_capture_on_commit_callbacks
):
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    body = {**session.fence(), "expectedVersion": session.version, "availableSlots": 2}
    assert api.post(wire.SESSION_HEARTBEAT, body).status_code == 200  # credential now cached
    token = enrollment_token_create(worker_id=worker.worker_id)
    with django_capture_on_commit_callbacks(execute=True):  # the cache eviction runs on commit
        assert enroll(client, token.token).status_code == 201
    answer = api.post(wire.SESSION_HEARTBEAT, body)
    assert (answer.status_code, answer.json()["code"]) == (401, "credential_revoked")
    old = WorkerCredential.objects.get(pk=worker.credential_id)
    assert (old.state, old.revoke_reason) == (CredentialState.REVOKED, "re_enrolled")


def test_a_key_is_never_enrolled_twice(client, issued):
    worker, token = issued
    _, public_key = new_key_text()
    assert enroll(client, token.token, public_key).status_code == 201
    second = enrollment_token_create(worker_id=worker.pk)
    answer = enroll(client, second.token, public_key)
    assert (answer.status_code, answer.json()["field"]) == (400, "publicKey")


def test_a_revoked_worker_can_neither_get_nor_use_a_token(client, issued):
    worker, token = issued
    worker_revoke(worker_id=worker.pk)
    answer = enroll(client, token.token)  # issued before the revocation: expired by it
    assert (answer.status_code, answer.json()["code"]) == (403, "worker_revoked")
    with pytest.raises(DomainError) as refused:
        enrollment_token_create(worker_id=worker.pk)
    assert refused.value.code == "worker_revoked"


@pytest.mark.parametrize("ttl", [59, 30 * 24 * 3600 + 1])
def test_token_lifetime_is_bounded(issued, ttl):
    worker, _ = issued
    with pytest.raises(DomainError) as refused:
        enrollment_token_create(worker_id=worker.pk, ttl_seconds=ttl)
    assert (refused.value.code, refused.value.field) == ("validation_failed", "ttlSeconds")


def test_enrollment_is_rate_limited_per_client_address(client, issued, protocol_settings):
    protocol_settings(RATE_ENROLL="3/m")
    for _ in range(3):
        assert enroll(client, "qlenroll_guess", address="198.51.100.1").status_code == 401
    limited = enroll(client, "qlenroll_guess", address="198.51.100.1")
    assert (limited.status_code, limited.json()["code"]) == (429, "rate_limited")
    assert 1 <= int(limited["Retry-After"]) <= 60
    _, token = issued
    assert enroll(client, token.token, address="198.51.100.2").status_code == 201  # another address


def test_the_enroll_worker_command_prints_the_token_once(capsys):
    out = io.StringIO()
    call_command("enroll_worker", "gpu-box-1", "--token-only", stdout=out)
    token = out.getvalue().strip()
    assert token.startswith("qlenroll_")
    stored = EnrollmentToken.objects.get(worker__name="gpu-box-1")
    assert token not in str(EnrollmentToken.objects.values())

    assert stored.digest == token_digest(token)
    credential = worker_enroll(token=token, public_key=new_key_text()[1])
    assert credential.worker.name == "gpu-box-1"


def test_the_admin_action_shows_a_token_once(admin_client):
    worker = worker_create(name="edge-9")
    answer = admin_client.post(
        "/admin/workers/worker/",
        {"action": "issue_enrollment_token", "_selected_action": [str(worker.pk)]},
        follow=True,
    )
    assert answer.status_code == 200
    shown = [str(m) for m in answer.context["messages"]]
    assert len(shown) == 1 and "qlenroll_" in shown[0]
    token = shown[0].split("<code>")[1].split("</code>")[0]
    assert worker_enroll(token=token, public_key=new_key_text()[1]).worker_id == worker.pk
    assert EnrollmentToken.objects.get(worker=worker).created_by.is_staff


def test_re_enrolling_fences_the_live_session_and_returns_its_unstarted_work(issued):
    worker, token = issued
    key = Ed25519PrivateKey.generate()
    first = worker_enroll(token=token.token, public_key=public_key_text(key.public_key()))
    session = register(Enrolled(worker.pk, worker.name, first.pk, key))
    run = enqueue(make_revision())
    ticket = OfferTicket()
    lease_claim(
        worker_id=worker.pk,
        session_id=session.session_id,
        generation=1,
        offers=[OfferRequest(ticket.offer_id, ticket.token)],
    )
    again = enrollment_token_create(worker_id=worker.pk)
    worker_enroll(token=again.token, public_key=public_key_text(Ed25519PrivateKey.generate().public_key()))
    fenced = WorkerSession.objects.get(pk=session.session_id)
    assert (fenced.state, fenced.end_reason) == ("fenced", "re_enrolled")
    lease = RunDispatchLease.objects.get(run=run)
    assert (lease.state, lease.release_reason) == ("released", "session_replaced")
    assert run.attempts.get().state == "claimed"  # back in the queue, same attempt


def test_a_zero_token_lifetime_is_refused_not_defaulted(issued):
    worker, _ = issued
    with pytest.raises(DomainError) as refused:
        enrollment_token_create(worker_id=worker.pk, ttl_seconds=0)
    assert (refused.value.code, refused.value.field) == ("validation_failed", "ttlSeconds")
