"""A worker's public key must be a real Ed25519 key (ADR-0012 §1: every request proves
possession of the worker's private key).

For a small-order public key — the identity point, or any point of order dividing 8 — the
signature ``R = identity, S = 0`` verifies for every message under RFC 8032 as OpenSSL checks
it, so a worker enrolled with one could be impersonated without any private key. Such keys, and
mixed-order keys (an honest key plus a torsion point), are refused at enrollment and rotation,
and a credential that somehow holds one never authenticates a request.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from nacl.bindings import crypto_core_ed25519_add

from actions.enrollment import enrollment_token_create, worker_create
from protocol import strictjson, wire
from protocol.signing import sign_request
from tests.helpers import SignedClient, enrolled_worker
from workers.models import WorkerCredential, WorkerSession
from workers.principals import forget_credentials

pytestmark = pytest.mark.django_db

P = 2**255 - 19
IDENTITY = (1).to_bytes(32, "little")  # (x, y) = (0, 1)
ORDER_2 = (P - 1).to_bytes(32, "little")  # (0, -1)


def text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def honest() -> bytes:
    return Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


DEGENERATE = {
    "identity": IDENTITY,
    "all zero bytes (order 4)": bytes(32),
    "order 2": ORDER_2,
}


def enroll(client, token: str, public_key: str):
    return client.post(
        wire.ENROLL, {"token": token, "publicKey": public_key}, content_type="application/json"
    )


@pytest.mark.parametrize("raw", [*DEGENERATE.values(), None], ids=[*DEGENERATE, "mixed order"])
def test_enrollment_refuses_a_key_signatures_could_be_forged_for_and_spends_no_token(client, raw):
    raw = raw if raw is not None else crypto_core_ed25519_add(honest(), ORDER_2)
    worker = worker_create(name="edge-keys")
    issued = enrollment_token_create(worker_id=worker.pk)
    answer = enroll(client, issued.token, text(raw))
    assert (answer.status_code, answer.json()["code"], answer.json()["field"]) == (
        400,
        "validation_failed",
        "publicKey",
    )
    assert not WorkerCredential.objects.exists()
    assert enroll(client, issued.token, text(honest())).status_code == 201


@pytest.mark.parametrize("raw", DEGENERATE.values(), ids=DEGENERATE)
def test_rotation_refuses_a_degenerate_key(client, raw):
    worker = enrolled_worker()
    answer = SignedClient(client, worker).post(wire.ROTATE_KEY, {"publicKey": text(raw)})
    assert (answer.status_code, answer.json()["field"]) == (400, "publicKey")
    assert WorkerCredential.objects.filter(worker_id=worker.worker_id).count() == 1


def test_a_stored_degenerate_key_never_authenticates_a_forged_request(client):
    """Had such a key been stored (before keys were vetted), the universal forgery is refused."""
    worker = enrolled_worker()
    WorkerCredential.objects.filter(pk=worker.credential_id).update(public_key=text(IDENTITY))
    forget_credentials([worker.credential_id])
    body = strictjson.dumps({"sessionId": "0190b3c2-0000-7000-8000-000000000001", "generation": 1})
    headers = sign_request(
        method="POST",
        path=wire.SESSION_HEARTBEAT,
        body=body,
        key_id=worker.credential_id,
        private_key=Ed25519PrivateKey.generate(),
    )
    forged = base64.b64encode(IDENTITY + bytes(32)).decode()  # R = identity, S = 0
    headers["Signature"] = f"ql=:{forged}:"
    answer = client.generic(
        "POST", wire.SESSION_HEARTBEAT, body, content_type="application/json", headers=headers
    )
    assert (answer.status_code, answer.json()["code"]) == (401, "signature_invalid")
    assert not WorkerSession.objects.exists()
