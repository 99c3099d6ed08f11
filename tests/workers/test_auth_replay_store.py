"""Replay protection that does not forget: the standalone nonce store, the future-skew bound,
and the failed-authentication limit that never refuses a correctly signed request."""

from __future__ import annotations

import datetime
import logging
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api import auth
from core.errors import DomainError
from protocol import strictjson, wire
from tests.helpers import SignedClient, heartbeat, refused, send, signed_headers
from workers.nonces import ProcessNonceStore

pytestmark = pytest.mark.django_db


def test_a_captured_request_stays_refused_after_thousands_of_other_requests(
    client, worker_session, protocol_settings
):
    worker, session = worker_session
    protocol_settings(RATE_AUTH_FAILURES="10000/m")
    raw = strictjson.dumps(heartbeat(session))
    captured = signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
    assert send(client, wire.SESSION_HEARTBEAT, raw, captured).status_code == 200
    api = SignedClient(client, worker)
    for _ in range(400):  # more than Django's locmem cache keeps (300): an LRU would forget
        assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200
    for _ in range(200):  # and unknown key ids, which the credential cache remembers as unknown
        answer = api.post(
            wire.SESSION_HEARTBEAT,
            heartbeat(session),
            key_id=f"wkc_{time.monotonic_ns()}",
            key=Ed25519PrivateKey.generate(),
        )
        assert answer.status_code == 401
    refused(send(client, wire.SESSION_HEARTBEAT, raw, captured), 401, "signature_replayed")


def test_the_store_forgets_only_expired_nonces_and_fails_closed_when_full():
    store = ProcessNonceStore(capacity=2)
    assert store.add("a", 10, now=0) and store.add("b", 10, now=1)
    assert not store.add("a", 10, now=5)
    with pytest.raises(DomainError) as full:
        store.add("c", 10, now=5)
    assert full.value.code == "storage_busy" and full.value.retry_after >= 1
    assert store.add("c", 10, now=10.5)  # "a" expired at 10: room again, "b" still remembered
    assert not store.add("b", 10, now=10.5)
    assert len(store) == 2


def test_created_may_lead_the_server_clock_only_by_the_future_skew(client, worker_session, protocol_settings):
    worker, session = worker_session
    protocol_settings(SIGNATURE_FUTURE_SKEW_SECONDS=2)
    api = SignedClient(client, worker)
    now = datetime.datetime.now(datetime.UTC)
    refused(
        api.post(wire.SESSION_HEARTBEAT, heartbeat(session), created=now + datetime.timedelta(seconds=30)),
        401,
        "signature_stale",
    )
    assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200


def test_after_a_restart_a_request_received_by_the_previous_process_cannot_be_replayed(
    client, worker_session, monkeypatch, protocol_settings
):
    """Signed 2 s ahead (inside the future skew) just before a restart: the new process cannot
    know its nonce, and refuses it for being created before start + skew."""
    worker, session = worker_session
    protocol_settings(SIGNATURE_FUTURE_SKEW_SECONDS=2)
    raw = strictjson.dumps(heartbeat(session))
    ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    headers = signed_headers(worker, wire.SESSION_HEARTBEAT, raw, created=ahead)
    assert send(client, wire.SESSION_HEARTBEAT, raw, headers).status_code == 200
    monkeypatch.setattr(auth, "PROCESS_STARTED", int(time.time()))  # the server restarts now
    monkeypatch.setattr(auth, "PROCESS_NONCES", ProcessNonceStore(capacity=1000))  # and forgets
    refused(send(client, wire.SESSION_HEARTBEAT, raw, headers), 503, "signature_predates_restart")


def test_failed_authentications_never_lock_out_a_correctly_signed_worker(
    client, worker_session, protocol_settings
):
    worker, session = worker_session
    protocol_settings(RATE_AUTH_FAILURES="5/m")
    for _ in range(5):
        answer = client.post(wire.SESSION_HEARTBEAT, heartbeat(session), content_type="application/json")
        assert answer.status_code == 401
    refused(
        client.post(wire.SESSION_HEARTBEAT, heartbeat(session), content_type="application/json"),
        429,
        "rate_limited",
    )
    # the same address, correctly signed: always let through
    assert SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200


def test_a_request_signed_before_a_restart_is_logged_as_information_not_as_an_error(
    client, worker_session, monkeypatch, caplog
):
    """The agent re-signs and retries; a newcomer's second `make run` must not print ERROR."""
    worker, session = worker_session
    raw = strictjson.dumps(heartbeat(session))
    headers = signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
    monkeypatch.setattr(auth, "PROCESS_STARTED", int(time.time()) + 5)
    with caplog.at_level(logging.INFO):
        refused(send(client, wire.SESSION_HEARTBEAT, raw, headers), 503, "signature_predates_restart")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r for r in caplog.records if r.name == "api" and "signature_predates_restart" in r.getMessage()]
