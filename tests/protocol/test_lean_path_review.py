"""Review of issue 13 point 3 (fixed since): the lean verification path accepts targets the library
refuses, although ``protocol.signing`` promises "the set of accepted requests is the library's".

``_PLAIN_TARGET`` lets ``%`` through on its own, while the library's URL grammar (RFC 3986,
``http_message_signatures._url``) only takes ``%`` followed by two hex digits; the library
refuses such a target (``signature_invalid``) and so does its signer. Django hands the query
string through as sent (``get_full_path`` keeps ``%``), so a request to ``…?x=%zz`` whose
signature covers exactly those bytes is accepted by the lean path and refused by the library.
"""

from __future__ import annotations

import base64
import datetime
import re

import pytest
from django.test import Client

from protocol import signer, signing, strictjson
from protocol.errors import ProtocolError
from tests.helpers import enrolled_worker, heartbeat, register, send, signed_headers

CREATED = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
#: Targets outside RFC 3986 (a bare or malformed percent escape) the lean pattern lets through.
BAD_ESCAPES = [
    "/api/v1/worker/claim?x=%zz",
    "/api/v1/worker/claim?x=%",
    "/api/v1/worker/claim%zz",
    "/api/v1/worker/claim%4",
]


#: The pattern the lean path had (a bare ``%`` allowed): the base it built for such a target is
#: what a client that signs the bytes it sends would sign.
_PERMISSIVE_TARGET = re.compile(
    r"(/[A-Za-z0-9/._~%!$&'()*+,;=:@-]*)(?:\?([A-Za-z0-9/._~%!$&'()*+,;=:@?-]*))?\Z"
)


def _forged_base(params: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
    strict, signing._PLAIN_TARGET = signing._PLAIN_TARGET, _PERMISSIVE_TARGET
    try:
        base = signing._lean_signature_base(params, "POST", path, headers, body)
    finally:
        signing._PLAIN_TARGET = strict
    assert base is not None
    return base


def _signed_over_lean_base(key: signer.WorkerKey, path: str, body: bytes) -> dict[str, str]:
    """The agent's headers, with the signature over the base the lean path builds for ``path``
    (neither signer signs such a target; a client that signs the bytes it sends does)."""
    headers = signer.sign_request(
        method="POST",
        path="/api/v1/worker/claim",
        body=body,
        key_id="wkc_1",
        private_key=key,
        created=CREATED,
    )
    canonical = signing._canonical_input(headers)
    assert canonical is not None
    base = _forged_base(canonical[1], path, headers, body)
    headers["Signature"] = f"{signer.LABEL}=:" + base64.b64encode(key.sign(base)).decode("ascii") + ":"
    headers[signer.TARGET_HEADER] = f"POST {path}"
    return headers


def _verdict(headers: dict[str, str], path: str, public, body: bytes = b"{}"):
    try:
        return signing.verify_request(
            method="POST",
            path=path,
            headers=headers,
            body=body,
            now=CREATED.timestamp(),
            window_seconds=60,
            resolve_key=lambda key_id: public,
        )
    except ProtocolError as exc:
        return exc.code


@pytest.mark.parametrize("path", BAD_ESCAPES)
def test_the_lean_path_refuses_a_target_the_library_refuses(path, monkeypatch):
    key = signer.WorkerKey.generate()
    public = signing.load_public_key(key.public_key_text())
    headers = _signed_over_lean_base(key, path, b"{}")
    with_lean = _verdict(headers, path, public)
    monkeypatch.setattr(signing, "_lean_verified", lambda *args: False)
    library_only = _verdict(headers, path, public)
    assert library_only == "signature_invalid"
    # Observed: a SignedRequest — the lean path accepted it.
    assert with_lean == library_only


@pytest.mark.django_db
def test_a_heartbeat_to_a_target_with_a_malformed_escape_is_refused_over_http(client: Client):
    worker = enrolled_worker()
    session = register(worker)
    raw = strictjson.dumps(heartbeat(session))
    path = "/api/v1/worker/session/heartbeat?x=%zz"
    headers = signed_headers(worker, "/api/v1/worker/session/heartbeat", raw)
    canonical = signing._canonical_input(headers)
    assert canonical is not None
    base = _forged_base(canonical[1], path, headers, raw)
    headers["Signature"] = f"{signer.LABEL}=:" + base64.b64encode(worker.key.sign(base)).decode("ascii") + ":"
    headers[signer.TARGET_HEADER] = f"POST {path}"
    answer = send(client, path, raw, headers)
    # Observed: 200 — the library alone answers 401 signature_invalid for the same request.
    assert (answer.status_code, answer.json().get("code")) == (401, "signature_invalid")
