"""Replay protection that does not forget: the standalone nonce store (a table, so a restart
forgets nothing and refuses nothing fresh), the future-skew bound, and the failed-authentication
limit that never refuses a correctly signed request."""

from __future__ import annotations

import datetime
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection

from protocol import strictjson, wire
from tests.helpers import SignedClient, heartbeat, refused, send, signed_headers
from workers.models import ReplayNonce
from workers.nonces import nonce_insert, nonces_held, nonces_prune

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


def test_the_store_remembers_a_nonce_until_it_expires_and_the_sweep_prunes_only_expired_ones():
    assert nonce_insert("k:a", 10, now=1000) and nonce_insert("k:b", 100, now=1000)
    assert not nonce_insert("k:a", 10, now=1005)
    assert nonces_prune(batch=10, now=1005) == 0
    assert nonces_prune(batch=10, now=1011) == 1  # "a" expired at 1010; "b" stays
    assert list(ReplayNonce.objects.values_list("key", flat=True)) == ["k:b"] and nonces_held() == 1


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
    client, worker_session, protocol_settings
):
    """Signed 2 s ahead (inside the future skew) just before a restart: the nonce is in the
    database, which the new process reads, so the replay is refused as a replay."""
    worker, session = worker_session
    protocol_settings(SIGNATURE_FUTURE_SKEW_SECONDS=2)
    raw = strictjson.dumps(heartbeat(session))
    ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    headers = signed_headers(worker, wire.SESSION_HEARTBEAT, raw, created=ahead)
    assert send(client, wire.SESSION_HEARTBEAT, raw, headers).status_code == 200
    assert ReplayNonce.objects.filter(key__startswith=f"worker-nonce:{worker.credential_id}:").exists()
    refused(send(client, wire.SESSION_HEARTBEAT, raw, headers), 401, "signature_replayed")


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


@pytest.mark.postgres
def test_the_nonce_store_writes_only_the_indexes_its_lookups_use():
    """A signed request of the standalone profile inserts one nonce row: its primary key is the
    replay check and ``expires_at`` the pruning; no pattern index beside the key (workers 0008)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s ORDER BY indexname",
            [ReplayNonce._meta.db_table],
        )
        definitions = [row[0] for row in cursor.fetchall()]
    assert len(definitions) == 2, definitions
    assert not any("pattern_ops" in definition for definition in definitions), definitions
