"""The agent's light signer (protocol.signer, PyNaCl) against the server's profile (protocol.signing)."""

from __future__ import annotations

import datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from protocol import signer, signing
from protocol.errors import ProtocolError

CREATED = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize("path", ["/api/v1/worker/claim", "/api/v1/worker/x?a=1&b=%20", "/p?"])
@pytest.mark.parametrize("body", [b"", b'{"availableSlots":1}', "é\u2028".encode()])
def test_the_light_signer_writes_the_same_headers_as_the_library(path, body):
    library_key = Ed25519PrivateKey.generate()
    key = signer.WorkerKey.from_pem(
        library_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    )
    common = {
        "method": "post",
        "path": path,
        "body": body,
        "key_id": "wkc_1",
        "created": CREATED,
        "nonce": "n" * 22,
    }
    assert signer.sign_request(private_key=key, **common) == signing.sign_request(
        private_key=library_key, **common
    )
    assert key.public_key_text() == signing.public_key_text(library_key.public_key())


def test_the_server_verifies_what_the_light_signer_signs_and_refuses_a_changed_body():
    key = signer.WorkerKey.generate()
    public = signing.load_public_key(key.public_key_text())
    headers = signer.sign_request(
        method="POST", path="/api/v1/worker/claim", body=b"{}", key_id="wkc_1", private_key=key
    )
    verify = {
        "method": "POST",
        "path": "/api/v1/worker/claim",
        "headers": headers,
        "now": datetime.datetime.now(datetime.UTC).timestamp(),
        "window_seconds": 60,
        "resolve_key": lambda key_id: public,
    }
    assert signing.verify_request(body=b"{}", **verify).key_id == "wkc_1"
    with pytest.raises(ProtocolError) as refused:
        signing.verify_request(body=b'{"x":1}', **verify)
    assert refused.value.code == "content_digest_mismatch"


def test_a_key_round_trips_through_pem_and_anything_else_is_refused():
    key = signer.WorkerKey.generate()
    assert signer.WorkerKey.from_pem(key.to_pem()).public_key_text() == key.public_key_text()
    other = Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    for bad in (b"", other, key.to_pem().replace(b"MC4CAQAw", b"MC4CAQEw")):
        with pytest.raises(ValueError):
            signer.WorkerKey.from_pem(bad)
