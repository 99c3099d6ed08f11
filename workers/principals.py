"""Who a worker key id is: cached credentials and session owners (ADR-0012 §1).

Two small stores in the Django cache back worker authentication (``api.auth``):

* **credentials** — cached for ``CREDENTIAL_CACHE_SECONDS``; every write path that changes a
  credential evicts it on commit (:func:`forget_credentials`). In the standalone profile the
  operator's ``manage.py`` commands run in another process than ``manage.py serve``, so an
  eviction also rewrites a small *credential epoch* file next to the database; the key of every
  cached credential carries the epoch, so a revocation from the command line is refused on the
  server's very next request.
* **session owners** — which worker a session id belongs to (immutable once registered), so the
  worker API can refuse another worker's session id before any repository access
  (:func:`session_owner`).

With warm caches, resolving a request's principal and binding it runs no database query
(ADR-0012 §1: a body/principal mismatch is refused before any repository access).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.locmem import LocMemCache
from django.db import connection

from core.conf import protocol
from protocol.errors import ProtocolError

from .keys import worker_public_key
from .models import CredentialState, WorkerCredential, WorkerSession, WorkerState

log = logging.getLogger("qinglong.auth")

_CREDENTIAL_KEY = "worker-credential:{}:{}"
_SESSION_OWNER_KEY = "worker-session-owner:{}"
#: Session ownership never changes; a day keeps the hot set warm without growing for ever.
SESSION_OWNER_CACHE_SECONDS = 24 * 3600


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
        log.error(
            "could not write the credential epoch %s (%s): other processes of this installation keep "
            "cached credentials for up to CREDENTIAL_CACHE_SECONDS",
            path,
            exc,
        )


def _credential_key(key_id: str) -> str:
    return _CREDENTIAL_KEY.format(_credential_epoch(), key_id)


def _load_credential(key_id: str) -> _Credential | None:
    key = _credential_key(key_id)
    cached = cache.get(key)
    if cached is not None:
        return cached or None  # "" caches an unknown key id
    row = WorkerCredential.objects.select_related("worker").filter(pk=key_id).first()
    if row is None:
        cache.set(key, "", timeout=protocol().credential_cache_seconds)
        return None
    credential = _Credential(
        worker_id=str(row.worker_id),
        worker_name=row.worker.name,
        public_key=row.public_key,
        state=row.state,
        not_after=row.not_after.timestamp() if row.not_after else None,
        worker_state=row.worker.state,
    )
    cache.set(key, credential, timeout=protocol().credential_cache_seconds)
    return credential


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


#: A credential's key never changes: parse and vet it (libsodium's point check) once per
#: process, not on every request. Refused keys raise and are not cached.
trusted_key = functools.lru_cache(maxsize=4096)(worker_public_key)


def resolve_credential(key_id: str, *, now: float) -> tuple[WorkerPrincipal, str]:
    """The principal and the stored public key (text) for ``key_id``; raises as :func:`principal_for`."""
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
    return resolve_credential(key_id, now=now)[0]


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
