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


# --- the server's lean verification path (protocol.signing) ---------------------------------------

LEAN_PATHS = ["/api/v1/worker/claim", "/api/v1/worker/x?a=1&b=%20", "/p?", "/a/b;c=d?x=y?z"]


def _library_base(headers: dict[str, str], method: str, path: str) -> bytes:
    verifier = signing._Verifier(signature_algorithm=signing.ED25519, key_resolver=None)
    sig_input = verifier._parse_signature_dictionary(headers["Signature-Input"])[signer.LABEL]
    base, _, _ = verifier._build_signature_base(
        signing.Message(method=method, url=signing._AUTHORITY + path, headers=headers),
        covered_component_ids=list(sig_input),
        signature_params=sig_input.params,
    )
    return base.encode("ascii")


@pytest.mark.parametrize("path", LEAN_PATHS)
@pytest.mark.parametrize("body", [b"", b'{"availableSlots":1}', "é\u2028".encode()])
def test_the_lean_signature_base_is_byte_equal_to_the_librarys(path, body):
    headers = signer.sign_request(
        method="POST", path=path, body=body, key_id="wkc_1.x-y", private_key=signer.WorkerKey.generate()
    )
    canonical = signing._canonical_input(headers)
    assert canonical is not None, "the agent's spelling must take the lean path"
    assert canonical[0] == signing.parse_signature_input(headers)
    lean = signing._lean_signature_base(canonical[1], "POST", path, headers, body)
    assert lean == _library_base(headers, "POST", path)


def _verdict(headers, *, path="/api/v1/worker/claim", body=b"{}", public=None, method="POST"):
    try:
        return signing.verify_request(
            method=method,
            path=path,
            headers=headers,
            body=body,
            now=CREATED.timestamp(),
            window_seconds=60,
            resolve_key=lambda key_id: public,
        )
    except ProtocolError as exc:
        return exc.code


def _variants(headers: dict[str, str]) -> dict[str, dict[str, str]]:
    """The agent's headers and respellings of them: some mean the same, some are forged."""
    sig_input, signature = headers["Signature-Input"], headers["Signature"]
    flipped = signature[:10] + ("A" if signature[10] != "A" else "B") + signature[11:]
    reordered = sig_input.replace(';alg="ed25519"', "") + ';alg="ed25519"'
    return {
        "as signed": headers,
        "forged signature": {**headers, "Signature": flipped},
        "stray pad bits": {**headers, "Signature": signature[:-4] + chr(ord(signature[-4]) ^ 1) + "==:"},
        "parameters reordered": {**headers, "Signature-Input": reordered},
        "spaces in the signature": {**headers, "Signature": signature.replace("=:", "= :", 1)},
        "digest respelt": {**headers, "Content-Digest": headers["Content-Digest"] + " "},
        "digest of another body": {**headers, "Content-Digest": signer.content_digest(b"[]")},
        "created with a leading zero": {
            **headers,
            "Signature-Input": sig_input.replace("created=", "created=0"),
        },
    }


@pytest.mark.parametrize("path", LEAN_PATHS)
def test_the_lean_path_accepts_and_refuses_exactly_what_the_library_does(path, monkeypatch):
    key = signer.WorkerKey.generate()
    public = signing.load_public_key(key.public_key_text())
    other = signing.load_public_key(signer.WorkerKey.generate().public_key_text())
    headers = signer.sign_request(
        method="POST", path=path, body=b"{}", key_id="wkc_1", private_key=key, created=CREATED
    )
    cases = [
        (name, variant, request_path, pub)
        for name, variant in _variants(headers).items()
        for request_path in (path, "/api/v1/worker/other")
        for pub in (public, other)
    ]
    with_lean = [_verdict(h, path=p, public=k) for _, h, p, k in cases]
    monkeypatch.setattr(signing, "_lean_verified", lambda *args: False)
    library_only = [_verdict(h, path=p, public=k) for _, h, p, k in cases]
    assert with_lean == library_only
    assert isinstance(with_lean[0], signing.SignedRequest)  # as signed, the worker's key: accepted
    assert with_lean[1] == "signature_invalid"  # another key
    assert with_lean[2] == "signature_path_mismatch"  # sent to another target than it was signed for


def test_the_agents_requests_verify_without_the_library(monkeypatch):
    """The lean path really carries the agent's requests (the library is never asked)."""
    key = signer.WorkerKey.generate()
    public = signing.load_public_key(key.public_key_text())
    headers = signer.sign_request(
        method="POST",
        path="/api/v1/worker/claim",
        body=b"{}",
        key_id="wkc_1",
        private_key=key,
        created=CREATED,
    )

    def refuse(*args, **kwargs):
        raise AssertionError("the library was asked")

    monkeypatch.setattr(signing._Verifier, "verify", refuse)
    monkeypatch.setattr(signing, "parse_signature_input", refuse)
    assert _verdict(headers, public=public).key_id == "wkc_1"
