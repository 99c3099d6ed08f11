"""Worker authentication: RFC 9421 signatures → ``WorkerPrincipal`` (ADR-0012 §1).

``WorkerSignatureAuthentication`` is the only way into the worker API. It verifies the request
against the signing profile (``protocol.signing``), using the *server's* clock for the
``created`` window, resolves the ``keyid`` to a credential (active, or rotated and inside its
grace period), and accepts each nonce once: nonces live in the shared cache for twice the window
(Redis in the cluster profile, so every replica sees them; the single standalone process uses its
own memory). Credentials are cached for ``CREDENTIAL_CACHE_SECONDS``; every write path that
changes a credential evicts it on commit, so a revocation is refused on the very next request.

With a warm cache, authenticating a request runs no database query, which is what lets the
worker API refuse a body/principal mismatch before *any* repository access (ADR-0012 §1).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from django.core.cache import cache
from rest_framework.authentication import BaseAuthentication

from protocol.errors import ProtocolError
from protocol.signing import SignedRequest, load_public_key, verify_request
from qinglong.conf import protocol

from .models import CredentialState, WorkerCredential, WorkerState

_CREDENTIAL_KEY = "worker-credential:{}"
_NONCE_KEY = "worker-nonce:{}:{}"


@dataclass(frozen=True)
class WorkerPrincipal:
    """The authenticated worker behind a request. Identity comes from here, never from a body."""

    worker_id: uuid.UUID
    worker_name: str
    credential_id: str

    is_authenticated = True
    is_staff = False
    pk = None  # not a Django user: it can never pass an operator permission

    def __str__(self) -> str:
        return f"worker:{self.worker_name}"


@dataclass(frozen=True)
class _Credential:
    worker_id: str
    worker_name: str
    public_key: str
    state: str
    not_after: float | None
    worker_state: str


def _load_credential(key_id: str) -> _Credential | None:
    key = _CREDENTIAL_KEY.format(key_id)
    cached = cache.get(key)
    if cached is not None:
        return cached or None  # "" caches an unknown key id
    row = WorkerCredential.objects.select_related("worker").filter(pk=key_id).first()
    value = (
        _Credential(
            worker_id=str(row.worker_id),
            worker_name=row.worker.name,
            public_key=row.public_key,
            state=row.state,
            not_after=row.not_after.timestamp() if row.not_after else None,
            worker_state=row.worker.state,
        )
        if row
        else ""
    )
    cache.set(key, value, timeout=protocol().credential_cache_seconds)
    return value or None


def forget_credentials(credential_ids: list[str]) -> None:
    """Evict credentials from the cache (called on commit of every credential change)."""
    cache.delete_many([_CREDENTIAL_KEY.format(key_id) for key_id in credential_ids])


def principal_for(key_id: str, *, now: float) -> WorkerPrincipal:
    """Resolve a key id to its principal, or raise ProtocolError with the credential code."""
    credential = _load_credential(key_id)
    if credential is None:
        raise ProtocolError("credential_unknown", "no credential has this keyid")
    if credential.state == CredentialState.REVOKED or credential.worker_state == WorkerState.REVOKED:
        raise ProtocolError("credential_revoked", "the credential was revoked")
    if credential.state == CredentialState.ROTATED and (credential.not_after or 0) <= now:
        raise ProtocolError("credential_expired", "the rotated credential's grace period is over")
    return WorkerPrincipal(
        worker_id=uuid.UUID(credential.worker_id), worker_name=credential.worker_name, credential_id=key_id
    )


class WorkerSignatureAuthentication(BaseAuthentication):
    """DRF authentication for worker endpoints. Sets ``request.user`` to a ``WorkerPrincipal``.

    Raises ProtocolError (mapped to 401 by the API exception handler) with ``signature_missing``,
    ``signature_malformed``, ``signature_stale``, ``credential_unknown``, ``credential_revoked``,
    ``credential_expired``, ``content_digest_mismatch``, ``signature_path_mismatch``,
    ``signature_invalid`` or ``signature_replayed``.
    """

    def authenticate(self, request) -> tuple[WorkerPrincipal, SignedRequest]:
        raw = request._request
        now = time.time()
        window = protocol().signature_window_seconds
        resolved: dict[str, WorkerPrincipal] = {}

        def resolve_key(key_id: str):
            principal = principal_for(key_id, now=now)
            resolved["principal"] = principal
            return load_public_key(_load_credential(key_id).public_key)

        signed = verify_request(
            method=raw.method,
            path=raw.get_full_path(),
            headers=raw.headers,
            body=raw.body,
            now=now,
            window_seconds=window,
            resolve_key=resolve_key,
        )
        # Remember the nonce only after the signature verified, so forged requests cannot burn
        # a worker's nonces. add() is atomic: of two replicas seeing the same nonce, one wins.
        if not cache.add(_NONCE_KEY.format(signed.key_id, signed.nonce), 1, timeout=2 * window):
            raise ProtocolError("signature_replayed", "this signature nonce was already used")
        return resolved["principal"], signed

    def authenticate_header(self, request) -> str:
        return 'Signature realm="qinglong-worker", alg="ed25519"'
