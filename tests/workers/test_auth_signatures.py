"""Request authentication (ADR-0012 §1): every way a signed worker request can be wrong gets its
own 401 code, and a refused request changes nothing."""

from __future__ import annotations

import datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import Event
from protocol import strictjson, wire
from protocol.signing import sign_request
from tests.helpers import SignedClient, enrolled_worker, heartbeat, refused, send, signed_headers
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db


def rows():
    return list(WorkerSession.objects.order_by("pk").values()), Event.objects.count()


def test_a_replayed_request_is_refused_and_changes_nothing(client, worker_session):
    worker, session = worker_session
    raw = strictjson.dumps(heartbeat(session, availableSlots=0))  # a heartbeat that writes
    headers = signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
    first = send(client, wire.SESSION_HEARTBEAT, raw, headers)
    assert first.status_code == 200, first.json()
    before = rows()
    again = send(client, wire.SESSION_HEARTBEAT, raw, headers)
    refused(again, 401, "signature_replayed")
    assert rows() == before


def test_a_nonce_is_single_use_across_endpoints_too(client, worker_session):
    worker, session = worker_session
    api = SignedClient(client, worker)
    assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session), nonce="n" * 22).status_code == 200
    refused(
        api.post(wire.SESSION_DRAIN, {**session.fence(), "expectedVersion": session.version}, nonce="n" * 22),
        401,
        "signature_replayed",
    )


@pytest.mark.parametrize("offset", [-65, +65, -3600])
def test_a_request_outside_the_server_clock_window_is_stale(client, worker_session, offset):
    worker, session = worker_session
    created = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset)
    before = rows()
    refused(
        SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat(session), created=created),
        401,
        "signature_stale",
    )
    assert rows() == before


def test_the_window_is_a_setting_read_on_every_request(
    client, worker_session, protocol_settings, monkeypatch
):
    worker, session = worker_session
    created = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=20)
    api = SignedClient(client, worker)
    assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session), created=created).status_code == 200
    protocol_settings(SIGNATURE_WINDOW_SECONDS=10)
    refused(api.post(wire.SESSION_HEARTBEAT, heartbeat(session), created=created), 401, "signature_stale")


def test_a_request_signed_with_another_key_is_refused(client, worker_session):
    worker, session = worker_session
    other = enrolled_worker()
    refused(
        SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat(session), key=other.key),
        401,
        "signature_invalid",
    )


def test_a_request_signed_for_another_path_is_refused(client, worker_session):
    worker, session = worker_session
    raw = strictjson.dumps({**session.fence(), "expectedVersion": session.version})
    headers = signed_headers(worker, wire.SESSION_HEARTBEAT, raw)  # signed for heartbeat …
    before = rows()
    refused(
        send(client, wire.SESSION_OFFLINE, raw, headers), 401, "signature_path_mismatch"
    )  # … sent to offline
    assert rows() == before


def test_a_request_with_an_added_query_string_is_refused(client, worker_session):
    worker, session = worker_session
    raw = strictjson.dumps(heartbeat(session))
    headers = signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
    refused(send(client, wire.SESSION_HEARTBEAT + "?force=1", raw, headers), 401, "signature_path_mismatch")
    del headers["QL-Target"]  # without the diagnostic header it is just a signature that does not verify
    refused(send(client, wire.SESSION_HEARTBEAT + "?force=1", raw, headers), 401, "signature_invalid")


def test_a_tampered_body_is_refused(client, worker_session):
    worker, session = worker_session
    raw = strictjson.dumps(heartbeat(session, availableSlots=2))
    headers = signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
    tampered = strictjson.dumps(heartbeat(session, availableSlots=0))
    before = rows()
    refused(send(client, wire.SESSION_HEARTBEAT, tampered, headers), 401, "content_digest_mismatch")
    # … and with a digest recomputed for the new body, the signature no longer covers it.
    rehashed = {
        **headers,
        "Content-Digest": signed_headers(worker, wire.SESSION_HEARTBEAT, tampered)["Content-Digest"],
    }
    refused(send(client, wire.SESSION_HEARTBEAT, tampered, rehashed), 401, "signature_invalid")
    assert rows() == before


def test_unknown_keyid_missing_and_malformed_signatures(client, worker_session):
    worker, session = worker_session
    raw = strictjson.dumps(heartbeat(session))
    refused(
        send(
            client,
            wire.SESSION_HEARTBEAT,
            raw,
            signed_headers(
                worker,
                wire.SESSION_HEARTBEAT,
                raw,
            )
            | {"Signature-Input": "ql=();created=1"},
        ),
        401,
        "signature_malformed",
    )
    unknown = sign_request(
        method="POST",
        path=wire.SESSION_HEARTBEAT,
        body=raw,
        key_id="wkc_nobody",
        private_key=Ed25519PrivateKey.generate(),
    )
    refused(send(client, wire.SESSION_HEARTBEAT, raw, unknown), 401, "credential_unknown")
    refused(send(client, wire.SESSION_HEARTBEAT, raw, {}), 401, "signature_missing")
    headers = signed_headers(worker, wire.SESSION_HEARTBEAT, raw)
    del headers["Content-Digest"]
    refused(send(client, wire.SESSION_HEARTBEAT, raw, headers), 401, "signature_malformed")


def test_a_401_names_the_signature_scheme(client, worker_session):
    _, session = worker_session
    answer = client.post(wire.SESSION_HEARTBEAT, heartbeat(session), content_type="application/json")
    assert answer["WWW-Authenticate"].startswith("Signature ")


def test_a_warm_request_authenticates_without_a_query(client, worker_session):
    worker, session = worker_session
    api = SignedClient(client, worker)
    assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200
    # A heartbeat that changes nothing is a pure read of the session: only the service's reads
    # remain once the credential and session owner are cached.
    with CaptureQueriesContext(connection) as queries:
        assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200
    assert not any("worker_credential" in q["sql"] for q in queries), [q["sql"] for q in queries]


def test_failed_authentications_are_limited_per_address_not_per_worker(
    client, worker_session, protocol_settings
):
    worker, session = worker_session
    protocol_settings(RATE_AUTH_FAILURES="3/m")
    forger = {"REMOTE_ADDR": "198.51.100.9"}
    raw = strictjson.dumps(heartbeat(session))
    forged = sign_request(
        method="POST",
        path=wire.SESSION_HEARTBEAT,
        body=raw,
        key_id=worker.credential_id,
        private_key=Ed25519PrivateKey.generate(),
    )
    for _ in range(3):
        answer = client.generic(
            "POST", wire.SESSION_HEARTBEAT, raw, content_type="application/json", headers=forged, **forger
        )
        refused(answer, 401, "signature_invalid")
    answer = client.generic(
        "POST", wire.SESSION_HEARTBEAT, raw, content_type="application/json", headers=forged, **forger
    )
    refused(answer, 429, "rate_limited")
    assert 1 <= int(answer["Retry-After"]) <= 60
    # the worker itself, from its own address, is not locked out by the forger
    assert SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200
