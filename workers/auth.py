"""Worker authentication: RFC 9421 signatures → ``WorkerPrincipal`` (ADR-0012 §1).

``WorkerSignatureAuthentication`` is the only way into the worker API. It verifies the request
against the signing profile (``protocol.signing``), using the *server's* clock for the
``created`` window, resolves the ``keyid`` to a credential (active, or rotated and inside its
grace period), and accepts each nonce once (:func:`nonce_accept`).

Three small stores back it, all in the Django cache:

* **nonces** — ``cache.add()`` is atomic, so of two requests carrying one nonce exactly one wins.
  The cluster profile's cache is Redis, shared by every replica; the standalone profile's is the
  memory of its single process. A per-process store forgets everything on restart, so in that
  profile a request signed before this process started is refused with
  ``signature_predates_restart`` (503: the agent signs again) instead of trusting a store that
  never saw its nonce.
* **credentials** — cached for ``CREDENTIAL_CACHE_SECONDS``; every write path that changes a
  credential evicts it on commit (:func:`forget_credentials`). In the standalone profile the
  operator's ``manage.py`` commands run in another process than ``manage.py serve``, so an
  eviction also rewrites a small *credential epoch* file next to the database; the key of every
  cached credential carries the epoch, so a revocation from the command line is refused on the
  server's very next request.
* **session owners** — which worker a session id belongs to (immutable once registered), so the
  worker API can refuse another worker's session id before any repository access
  (:func:`session_owner`).

With warm caches, authenticating a request and binding it to its principal runs no database
query, which is what lets the worker API refuse a body/principal mismatch before *any*
repository access (ADR-0012 §1; PRODUCT invariant 1).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.locmem import LocMemCache
from django.db import connection
from rest_framework.authentication import BaseAuthentication

from protocol.errors import ProtocolError
from protocol.signing import SignedRequest, verify_request
from qinglong.api.ratelimit import by_address, client_address, enforce
from qinglong.conf import protocol
from qinglong.errors import DomainError

from .keys import worker_public_key
from .models import CredentialState, WorkerCredential, WorkerSession, WorkerState
from .nonces import ProcessNonceStore

log = logging.getLogger("qinglong.auth")

_CREDENTIAL_KEY = "worker-credential:{}:{}"
_NONCE_KEY = "worker-nonce:{}:{}"
_SESSION_OWNER_KEY = "worker-session-owner:{}"
#: Session ownership never changes; a day keeps the hot set warm without growing for ever.
SESSION_OWNER_CACHE_SECONDS = 24 * 3600

#: Wall-clock second this process started (read from settings, which load first thing). A
#: per-process nonce store knows nothing older.
PROCESS_STARTED = int(getattr(settings, "QINGLONG_PROCESS_STARTED", time.time()))
#: The standalone profile's replay memory (see workers.nonces); unused with a shared cache.
PROCESS_NONCES = ProcessNonceStore(capacity=int(settings.QINGLONG.get("NONCE_STORE_CAPACITY", 100_000)))


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


def cache_is_shared() -> bool:
    """True when the default cache is shared between processes (Redis: the cluster profile, or
    ``QINGLONG_SHARED_CACHE``), False for the standalone profile's per-process locmem cache."""
    return not isinstance(caches["default"], LocMemCache)


# --- credential epoch (standalone: several processes, per-process caches) ------------------------


def _epoch_path() -> Path:
    """One epoch file per database, so parallel test databases never disturb each other."""
    name = str(connection.settings_dict.get("NAME") or "")
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
    return Path(settings.VAR_DIR) / f"credential-epoch-{digest}"


def _credential_epoch() -> str:
    """The current epoch ("" with a shared cache, where eviction reaches every replica directly)."""
    if cache_is_shared():
        return ""
    try:
        return _epoch_path().read_text(encoding="ascii")[:64]
    except OSError:
        return "0"


def _bump_credential_epoch() -> None:
    path = _epoch_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        tmp.write_text(secrets.token_hex(8), encoding="ascii")
        os.replace(tmp, path)
    except OSError as exc:  # the change is committed; only other processes learn of it late
        log.error("could not write the credential epoch %s (%s): other processes of this installation keep "
                  "cached credentials for up to CREDENTIAL_CACHE_SECONDS", path, exc)


def _credential_key(key_id: str) -> str:
    return _CREDENTIAL_KEY.format(_credential_epoch(), key_id)


def _load_credential(key_id: str) -> _Credential | None:
    key = _credential_key(key_id)
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
    """Evict credentials from every process's cache; call it on commit of a credential change.

    ``credential_ids``: the changed credentials' ids (RFC 9421 keyids). With a shared cache the
    keys are deleted for all replicas; with per-process caches the epoch file is rewritten too,
    so other processes of the installation (``manage.py serve`` when a command revoked) stop
    trusting what they cached (ADR-0012 §1: a revoked credential fails on the next request).
    Never raises: an unwritable state directory is logged, and other processes then notice
    within ``CREDENTIAL_CACHE_SECONDS``.
    """
    cache.delete_many([_credential_key(key_id) for key_id in credential_ids])
    if not cache_is_shared():
        _bump_credential_epoch()


#: A credential's key never changes: parse and vet it (libsodium's point check, ~80 µs) once per
#: process, not on every request. Refused keys raise and are not cached.
_trusted_key = functools.lru_cache(maxsize=4096)(worker_public_key)


def _resolve(key_id: str, *, now: float) -> tuple[WorkerPrincipal, str]:
    credential = _load_credential(key_id)
    if credential is None:
        raise ProtocolError("credential_unknown", "no credential has this keyid")
    if credential.state == CredentialState.REVOKED or credential.worker_state == WorkerState.REVOKED:
        raise ProtocolError("credential_revoked", "the credential was revoked")
    if credential.state == CredentialState.ROTATED and (credential.not_after or 0) <= now:
        raise ProtocolError("credential_expired", "the rotated credential's grace period is over")
    principal = WorkerPrincipal(
        worker_id=uuid.UUID(credential.worker_id), worker_name=credential.worker_name, credential_id=key_id
    )
    return principal, credential.public_key


def principal_for(key_id: str, *, now: float) -> WorkerPrincipal:
    """Resolve a key id to its principal, or raise ProtocolError with the credential code.

    ``now``: the server's clock, unix seconds. Raises ``credential_unknown``,
    ``credential_revoked`` (credential or worker revoked) or ``credential_expired`` (a rotated
    key past its grace period, ``ROTATION_GRACE_SECONDS``).
    """
    return _resolve(key_id, now=now)[0]


# --- nonces ------------------------------------------------------------------------------------------


def nonce_accept(*, key_id: str, nonce: str, created: int, window_seconds: int) -> None:
    """Accept one (keyid, nonce) pair once within the signature window (ADR-0012 §1 replay limits).

    ``created``: the signature's creation time (unix seconds, already checked against the
    window); ``window_seconds``: ``SIGNATURE_WINDOW_SECONDS``. The nonce is kept for twice the
    window, longer than any signature carrying it can be fresh. ``cache.add`` is atomic (Redis
    ``SET NX`` in the cluster profile, a locked dict in the standalone process), so two replicas
    or threads racing with one nonce see exactly one success.

    The standalone profile keeps nonces in this process (``workers.nonces``, exact until expiry,
    failing closed when full) and so knows nothing from before it started: a request may have
    been received earlier only if it was created no later than start + the allowed future skew, and
    such a request is refused as ``signature_predates_restart`` (503, retryable: sign again).

    Raises ProtocolError ``signature_replayed``; DomainError ``signature_predates_restart``, or
    ``storage_busy`` when the in-process store is full of unexpired nonces.
    """
    key = _NONCE_KEY.format(key_id, nonce)
    if cache_is_shared():
        accepted = cache.add(key, 1, timeout=2 * window_seconds)
    else:
        # created is a whole second; P = floor(start). A request received before the start was
        # signed at most `skew` ahead of a moment before it: created <= P + skew.
        if created <= PROCESS_STARTED + protocol().signature_future_skew_seconds:
            raise DomainError(
                "signature_predates_restart",
                "the request was signed before the control plane restarted; sign it again",
                retry_after=1,
            )
        accepted = PROCESS_NONCES.add(key, 2 * window_seconds)
    if not accepted:
        raise ProtocolError("signature_replayed", "this signature nonce was already used")


# --- session ownership ---------------------------------------------------------------------------------


def remember_session_owner(session_id: uuid.UUID | str, worker_id: uuid.UUID | str) -> None:
    """Cache that ``session_id`` belongs to ``worker_id``; call it once the registration committed.

    Kept ``SESSION_OWNER_CACHE_SECONDS`` (a session never changes owner), so principal binding
    (ADR-0012 §1) can refuse another worker's session id without a query. Raises nothing.
    """
    cache.set(_SESSION_OWNER_KEY.format(session_id), str(worker_id), timeout=SESSION_OWNER_CACHE_SECONDS)


def session_owner(session_id: object) -> str | None:
    """The worker id (text) a session id belongs to, or None if it names no session (ADR-0012 §1).

    ``session_id``: anything a body or path carried; a value that is not a UUID string returns
    None (the serializer then refuses it by field). A cache hit runs no query; a miss runs one
    primary-key lookup and caches the answer, since a session never changes owner. Raises
    nothing but database errors.
    """
    try:
        parsed = uuid.UUID(str(session_id))
    except (TypeError, ValueError, AttributeError):
        return None
    key = _SESSION_OWNER_KEY.format(parsed)
    owner = cache.get(key)
    if owner is not None:
        return owner
    found = WorkerSession.objects.filter(pk=parsed).values_list("worker_id", flat=True).first()
    if found is None:
        return None
    remember_session_owner(parsed, found)
    return str(found)


# --- the DRF authentication class ------------------------------------------------------------------


class WorkerSignatureAuthentication(BaseAuthentication):
    """DRF authentication for worker endpoints. Sets ``request.user`` to a ``WorkerPrincipal``.

    Raises ProtocolError (mapped to 401 by the API exception handler) with ``signature_missing``,
    ``signature_malformed``, ``signature_stale``, ``credential_unknown``, ``credential_revoked``,
    ``credential_expired``, ``content_digest_mismatch``, ``signature_path_mismatch``,
    ``signature_invalid`` or ``signature_replayed``; DomainError ``signature_predates_restart``
    (503) and ``rate_limited`` (429) instead of the failure once a client address has failed
    authentication more than ``RATE_AUTH_FAILURES`` times. Only failing requests are counted and
    limited: a correctly signed request is never refused by this limit, so a forger sharing a
    worker's address (NAT, same host) cannot lock it out.
    """

    def authenticate(self, request) -> tuple[WorkerPrincipal, SignedRequest]:
        raw = request._request
        limit = {"group": "worker-auth-failures", "key": by_address, "rate": protocol().rate_auth_failures,
                 "message": "too many failed worker authentications from this address"}
        # Only failures count, and only a failing request is answered 429: a correctly signed
        # request always passes, so a forger sharing a worker's address cannot lock it out.
        try:
            return self._authenticate(raw)
        except (ProtocolError, DomainError) as exc:
            log.warning("worker request refused: %s (%s %s from %s)", exc.code, raw.method, raw.path,
                        client_address(raw))
            if exc.code != "signature_predates_restart":
                enforce(raw, **limit)  # counts this failure; the next over the limit gets 429
            raise

    def _authenticate(self, raw) -> tuple[WorkerPrincipal, SignedRequest]:
        now = time.time()
        window = protocol().signature_window_seconds
        resolved: dict[str, WorkerPrincipal] = {}

        def resolve_key(key_id: str):
            resolved["principal"], public_key = _resolve(key_id, now=now)
            try:
                return _trusted_key(public_key)
            except ProtocolError:  # stored before keys were vetted: never trust it
                raise ProtocolError("signature_invalid", "the credential's public key is not usable") from None

        signed = verify_request(
            method=raw.method,
            path=raw.get_full_path(),
            headers=raw.headers,
            body=raw.body,
            now=now,
            window_seconds=window,
            future_skew_seconds=protocol().signature_future_skew_seconds,
            resolve_key=resolve_key,
        )
        # Remember the nonce only after the signature verified, so forged requests cannot burn
        # a worker's nonces.
        nonce_accept(key_id=signed.key_id, nonce=signed.nonce, created=signed.created, window_seconds=window)
        return resolved["principal"], signed

    def authenticate_header(self, request) -> str:
        return 'Signature realm="qinglong-worker", alg="ed25519"'
