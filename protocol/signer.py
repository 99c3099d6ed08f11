"""The worker's half of the request-signing profile, light enough for the agent's memory budget.

``protocol.signing`` fixes the RFC 9421 profile and verifies it with ``http-message-signatures``
over ``cryptography`` (the server side). An idle agent only ever *signs*, and importing those two
packages costs it about 16 MiB of its 30 MiB budget (docs/performance.md), so this module builds
the profile's signature base itself — the profile is fixed: four covered components, five
parameters, one label — and signs it with PyNaCl (libsodium's Ed25519). Ed25519 signatures are
deterministic, so for the same key, ``created`` and nonce the headers are byte for byte what
``protocol.signing.sign_request`` produces (``tests/protocol/test_signer.py`` holds the two equal,
and the server's verifier accepts both).

Keys are :class:`WorkerKey` (a 32-byte Ed25519 seed) stored as unencrypted PKCS #8 PEM, the file
format the agent always wrote. Signing accepts any object with ``sign(data) -> 64 bytes`` (a
``cryptography`` ``Ed25519PrivateKey`` too).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import re
import secrets
from typing import Protocol

import nacl.signing

LABEL = "ql"
TAG = "qinglong-worker-v1"
ALGORITHM = "ed25519"
COVERED_COMPONENTS = ("@method", "@path", "@query", "content-digest")
TARGET_HEADER = "QL-Target"

#: DER prefix of an unencrypted PKCS #8 Ed25519 private key (RFC 8410 §7): version 0, algorithm
#: id-Ed25519 (1.3.101.112), then the 32-byte seed as an OCTET STRING inside an OCTET STRING.
_PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")
_PEM = re.compile(rb"-----BEGIN PRIVATE KEY-----\s*([A-Za-z0-9+/=\s]+?)\s*-----END PRIVATE KEY-----\s*\Z")


class Signer(Protocol):
    """Anything that signs bytes with Ed25519 (:class:`WorkerKey`, ``Ed25519PrivateKey``)."""

    def sign(self, data: bytes) -> bytes: ...


class WorkerKey:
    """A worker's Ed25519 private key (PyNaCl). ``generate()``, ``from_pem()``, ``to_pem()``."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError("an Ed25519 seed is 32 bytes")
        self._key = nacl.signing.SigningKey(seed)

    @classmethod
    def generate(cls) -> WorkerKey:
        return cls(secrets.token_bytes(32))

    @classmethod
    def from_pem(cls, pem: bytes) -> WorkerKey:
        """Parse an unencrypted PKCS #8 PEM Ed25519 key; raises ValueError for anything else."""
        found = _PEM.match(pem.strip() + b"\n")
        if found is None:
            raise ValueError("not a PEM private key")
        der = base64.b64decode(b"".join(found.group(1).split()), validate=True)
        if len(der) != len(_PKCS8_PREFIX) + 32 or not der.startswith(_PKCS8_PREFIX):
            raise ValueError("not an unencrypted PKCS #8 Ed25519 key")
        return cls(der[len(_PKCS8_PREFIX) :])

    def to_pem(self) -> bytes:
        """The key as unencrypted PKCS #8 PEM (what ``cryptography`` writes for the same key)."""
        der = _PKCS8_PREFIX + bytes(self._key)
        return b"-----BEGIN PRIVATE KEY-----\n" + base64.b64encode(der) + b"\n-----END PRIVATE KEY-----\n"

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return bytes(self._key.sign(data).signature)

    def public_key_text(self) -> str:
        """Raw public key as unpadded base64url, 43 characters (what enrollment sends)."""
        raw = bytes(self._key.verify_key)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def content_digest(body: bytes) -> str:
    """The RFC 9530 ``Content-Digest`` value of ``body`` (SHA-256)."""
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode("ascii") + ":"


def _sf_string(value: str) -> str:
    """An RFC 8941 sf-string (the profile's key ids, nonces and tag are plain ASCII)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sign_request(
    *,
    method: str,
    path: str,
    body: bytes,
    key_id: str,
    private_key: Signer,
    created: datetime.datetime | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """Return the headers that sign ``method path`` with ``body`` under the profile.

    ``path`` is the request target (path plus optional ``?query``); ``created`` defaults to now,
    ``nonce`` to 128 fresh bits. The same contract as ``protocol.signing.sign_request``.
    """
    method = method.upper()
    bare, _, query = path.partition("?")
    digest = content_digest(body)
    when = int((created or datetime.datetime.now(datetime.UTC)).timestamp())
    params = (
        "(" + " ".join(f'"{c}"' for c in COVERED_COMPONENTS) + ")"
        f";created={when};keyid={_sf_string(key_id)};alg={_sf_string(ALGORITHM)}"
        f";nonce={_sf_string(nonce or secrets.token_urlsafe(16))};tag={_sf_string(TAG)}"
    )
    base = (
        f'"@method": {method}\n"@path": {bare}\n"@query": ?{query}\n'
        f'"content-digest": {digest}\n"@signature-params": {params}'
    )
    signature = base64.b64encode(private_key.sign(base.encode("utf-8"))).decode("ascii")
    return {
        "Content-Digest": digest,
        "Signature-Input": f"{LABEL}={params}",
        "Signature": f"{LABEL}=:{signature}:",
        TARGET_HEADER: f"{method} {path}",
    }
