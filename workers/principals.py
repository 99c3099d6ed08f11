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

With the project's Redis cache (cluster profile) both also live in this process's memory, so a
warm request reads neither from Redis:

* a session's owner never changes: once known it is kept (:func:`session_owner`);
* a credential is kept at most ``CREDENTIAL_CACHE_SECONDS`` together with the *version* its
  Redis key ``worker-credential-version:<keyid>`` had when it was read. Every change evicts the
  credential and writes a new version (:func:`forget_credentials`); the version rides the
  request's nonce round trip (``core.cache.RedisCache.add_count_and_read``), and a request whose
  credential's version moved is judged again from Redis and the database
  (:meth:`CredentialStamp.current`) — so a revocation on any replica is refused on the next
  request on every replica, as without this layer (``api.auth``).

The copy in Redis carries the version read before the database was: a request that read the
credential just before a change committed writes back a copy of the old credential, under a
version the change has already moved, which no request takes as current.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import itertools
import logging
import os
import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.locmem import LocMemCache
from django.db import connection
from tenacity import Retrying, stop_after_attempt, wait_random_exponential

from core.conf import protocol
from protocol.errors import ProtocolError

from .keys import worker_public_key
from .models import CredentialState, WorkerCredential, WorkerSession, WorkerState

log = logging.getLogger("qinglong.auth")

#: Copies of credentials: with the shared cache a (credential, version) pair. ``-v2`` since that
#: pair replaced a bare credential: a replica of the release before reads the key it knows, and
#: would take a pair for a credential (its requests failing), so each format has its own key.
_CREDENTIAL_KEY = "worker-credential-v2:{}:{}"
#: The previous release's key, evicted as well while replicas of it may still serve (a rolling
#: deploy): a credential changed on this release must not stay cached on one of those.
_PREVIOUS_CREDENTIAL_KEY = "worker-credential:{}:{}"
_SESSION_OWNER_KEY = "worker-session-owner:{}"
_VERSION_KEY = "worker-credential-version:{}"
#: Session ownership never changes; a day keeps the hot set warm without growing for ever.
SESSION_OWNER_CACHE_SECONDS = 24 * 3600
#: Most entries of each in-process layer; a full layer is emptied (it refills from Redis).
LOCAL_ENTRIES = 20_000

#: {full cache key: (credential, version read with it, monotonic time read)} of this process.
_LOCAL_CREDENTIALS: dict[str, tuple[_Credential, int | None, float]] = {}
#: {full cache key: worker id} of this process: sessions never change owner.
_LOCAL_OWNERS: dict[str, str] = {}


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


def _local_layer() -> bool:
    """Whether credentials and session owners are also kept in process (the project's Redis
    cache, whose nonce round trip can read a credential's version; ``core.cache``)."""
    return hasattr(cache, "add_count_and_read") and cache_is_shared()


def _remember_locally(layer: dict, key: str, value) -> None:
    if len(layer) >= LOCAL_ENTRIES:
        layer.clear()
    layer[key] = value


@dataclass(frozen=True)
class CredentialStamp:
    """Which version of a credential a request was authenticated with (in-process layer only)."""

    key_id: str
    version: int | None

    @property
    def version_key(self) -> str:
        """The cache key of the credential's version (read in the request's nonce round trip)."""
        return _VERSION_KEY.format(self.key_id)

    def current(self, version: int | None) -> bool:
        """True when ``version`` (read after the signature verified) is the one the credential
        was read with; else the in-process copy is dropped and the caller must resolve again."""
        if self.version is not None and version == self.version:  # no version: nothing proves it
            return True
        _LOCAL_CREDENTIALS.pop(cache.make_key(_credential_key(self.key_id)), None)
        return False


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
    return _read_credential(key_id)[0]


def _read_credential(key_id: str) -> tuple[_Credential | None, int | None]:
    """The credential (None: no such key id) from the cache, else from the database, and the
    version it is current for (None with a per-process cache, where the epoch does that work).

    With a shared cache a copy is stored together with the version read *before* the database
    was: a change that commits between that read and the copy's write moves the version
    (:func:`forget_credentials`), so the stale copy it would leave is never taken as current —
    on any replica. One round trip reads both (``get_many``); a copy whose version is not the
    current one is read again from the database.
    """
    key = _credential_key(key_id)
    if _PENDING_EVICTIONS:  # a change this process could not evict yet: first that, or no answer
        flush_pending_evictions()
    if not cache_is_shared():
        cached = cache.get(key)
        if cached is not None:
            return cached or None, None  # "" caches an unknown key id
        credential = _credential_from_database(key_id)
        cache.set(key, credential or "", timeout=protocol().credential_cache_seconds)
        return credential, None
    version_key = _VERSION_KEY.format(key_id)
    found = cache.get_many([key, version_key])
    version = found.get(version_key)
    copy = found.get(key)
    if version is not None and isinstance(copy, tuple) and copy[1] == version:
        return copy[0], version
    if version is None:
        # No version yet (none written for a while): make one, so that a later change — or the
        # key's loss — moves it. Only a version this read created is trusted: if a change wrote
        # one in between, nothing read now is kept as current and each request is judged again.
        mine = secrets.randbits(62)
        version = mine if cache.add(version_key, mine, _version_lifetime()) else None
    credential = _credential_from_database(key_id)
    if version is not None:
        cache.set(key, (credential, version), timeout=protocol().credential_cache_seconds)
    return credential, version


def _load_credential_locally(key_id: str) -> tuple[_Credential | None, CredentialStamp]:
    """The credential from this process's layer, else from Redis (with its version, one round
    trip) or the database; an unknown key id is never kept in process."""
    local_key = cache.make_key(_credential_key(key_id))
    entry = _LOCAL_CREDENTIALS.get(local_key)
    if entry is not None and time.monotonic() - entry[2] < protocol().credential_cache_seconds:
        return entry[0], CredentialStamp(key_id, entry[1])
    read_at = time.monotonic()
    credential, version = _read_credential(key_id)
    if credential:
        _remember_locally(_LOCAL_CREDENTIALS, local_key, (credential, version, read_at))
    return credential, CredentialStamp(key_id, version)


def _credential_from_database(key_id: str) -> _Credential | None:
    row = WorkerCredential.objects.select_related("worker").filter(pk=key_id).first()
    if row is None:
        return None
    return _Credential(
        worker_id=str(row.worker_id),
        worker_name=row.worker.name,
        public_key=row.public_key,
        state=row.state,
        not_after=row.not_after.timestamp() if row.not_after else None,
        worker_state=row.worker.state,
    )


def forget_credentials(credential_ids: list[str]) -> None:
    """Evict credentials from every process's cache; call it on commit of a credential change.

    ``credential_ids``: the changed credentials' ids (RFC 9421 keyids). With a shared cache the
    keys are deleted for all replicas and each credential gets a new version (which ends every
    replica's copy in memory on its next request); with per-process caches the epoch file is rewritten too,
    so other processes of the installation (``manage.py serve`` when a command revoked) stop
    trusting what they cached (ADR-0012 §1: a revoked credential fails on the next request).

    Never raises (the change it follows has committed). Redis refusing the eviction is retried
    at once a few times; if it still fails the eviction is kept and made before this process
    reads any credential again, by a background thread as soon as Redis answers, and before the
    process exits (a ``manage.py`` command waits for it), until every copy it targets has expired
    (``CREDENTIAL_CACHE_SECONDS`` + :data:`EVICTION_MARGIN_SECONDS`); while Redis is down no
    request authenticates at all (``cache_unavailable``). An unwritable state directory is logged, and
    other processes then notice within ``CREDENTIAL_CACHE_SECONDS``.
    """
    if not cache_is_shared():
        cache.delete_many([_credential_key(key_id) for key_id in credential_ids])
        _bump_credential_epoch()
        return
    for key_id in credential_ids:  # this process never again serves its own copy
        _LOCAL_CREDENTIALS.pop(cache.make_key(_credential_key(key_id)), None)
    try:
        _EVICTION_RETRIES(_evict_shared, credential_ids)
    except Exception:  # Redis is unreachable: kept for later (above), never the caller's 500
        log.error(
            "could not evict changed credential(s) %s from the shared cache; retrying until Redis answers",
            ", ".join(credential_ids),
            exc_info=True,
        )
        _defer_eviction(credential_ids)


#: Immediate retries of an eviction (a blip of Redis): three tries within about a second.
_EVICTION_RETRIES = Retrying(
    stop=stop_after_attempt(3), wait=wait_random_exponential(multiplier=0.1, max=0.5), reraise=True
)
#: {credential id: (monotonic time after which every copy it could have left has expired, which
#: deferral)}: a flush removes only the deferrals it made.
_PENDING_EVICTIONS: dict[str, tuple[float, int]] = {}
_DEFERRALS = itertools.count()
_PENDING_LOCK = threading.Lock()
_evicter: threading.Thread | None = None
_waits_at_exit = False
#: Seconds between two tries of a pending eviction (each a connection attempt while Redis is down).
EVICTION_RETRY_SECONDS = 0.2
#: Past a copy's lifetime, how long a pending eviction is still tried (clocks of Redis and replicas).
EVICTION_MARGIN_SECONDS = 5


def _evict_shared(credential_ids: list[str]) -> None:
    # The shared copies go first: a process that reads between the two writes gets the database's
    # (changed) credential with the old version, which the new version then ends — never the old
    # credential with the new version.
    epoch = _credential_epoch()
    cache.delete_many(
        [
            key.format(epoch, key_id)
            for key_id in credential_ids
            for key in (_CREDENTIAL_KEY, _PREVIOUS_CREDENTIAL_KEY)
        ]
    )
    # A new version for every replica's in-process copy to notice; it outlives any copy.
    cache.set_many(
        {_VERSION_KEY.format(key_id): secrets.randbits(62) for key_id in credential_ids}, _version_lifetime()
    )


def _defer_eviction(credential_ids: list[str]) -> None:
    """Keep ``credential_ids`` to evict once Redis answers, with a thread trying until then; a
    process that exits first (a ``manage.py`` command) waits for it (:func:`_evict_before_exit`)."""
    global _evicter, _waits_at_exit
    until = time.monotonic() + protocol().credential_cache_seconds + EVICTION_MARGIN_SECONDS
    with _PENDING_LOCK:
        for key_id in credential_ids:
            _PENDING_EVICTIONS[key_id] = (until, next(_DEFERRALS))
        if not _waits_at_exit:
            atexit.register(_evict_before_exit)
            _waits_at_exit = True
        if _evicter is None:
            thread = threading.Thread(target=_evict_when_possible, name="credential-evictions", daemon=True)
            try:
                thread.start()
            except RuntimeError:
                # No thread to be had (at shutdown, out of threads): the evictions are made by
                # this process's next credential read or at its exit; a later deferral tries again.
                log.exception("could not start the credential eviction thread")
                return
            _evicter = thread  # published once started: a thread that never ran is never waited on


def flush_pending_evictions() -> None:
    """Make the evictions Redis refused earlier (:func:`forget_credentials`); raises the cache's
    error if it still refuses (the caller's request then answers ``cache_unavailable``)."""
    with _PENDING_LOCK:
        now = time.monotonic()
        for key_id in [k for k, (until, _) in _PENDING_EVICTIONS.items() if until <= now]:
            del _PENDING_EVICTIONS[key_id]  # every copy it could have left has expired
        pending = dict(_PENDING_EVICTIONS)
    if not pending:
        return
    _evict_shared(list(pending))
    with _PENDING_LOCK:
        for key_id, deferral in pending.items():
            # Deferred again meanwhile (a later change whose eviction failed after this one's
            # writes): that one is still to be made.
            if _PENDING_EVICTIONS.get(key_id) == deferral:
                del _PENDING_EVICTIONS[key_id]
    log.warning(
        "evicted changed credential(s) %s from the shared cache, now that it answers", ", ".join(pending)
    )


def _evict_when_possible() -> None:
    """The eviction thread: try every :data:`EVICTION_RETRY_SECONDS` until nothing is pending."""
    global _evicter
    while True:
        with _PENDING_LOCK:
            if not _PENDING_EVICTIONS:
                _evicter = None  # under the lock: a deferral from now on starts a new thread
                return
        try:
            flush_pending_evictions()
        except Exception:  # still unreachable
            time.sleep(EVICTION_RETRY_SECONDS)


def _evict_before_exit() -> None:
    """At exit, with evictions still pending (Redis unreachable since the change): keep trying
    until they are made or every copy they target has expired, so that a command's change is
    never left only in a cache that comes back (at most ``CREDENTIAL_CACHE_SECONDS`` + margin)."""
    if not _PENDING_EVICTIONS:
        return
    log.warning(
        "waiting for the shared cache to evict changed credential(s) %s before exiting (at most %ss)",
        ", ".join(_PENDING_EVICTIONS),
        protocol().credential_cache_seconds + EVICTION_MARGIN_SECONDS,
    )
    while _PENDING_EVICTIONS:
        try:
            flush_pending_evictions()
        except Exception:
            time.sleep(EVICTION_RETRY_SECONDS)


def _version_lifetime() -> int:
    """Seconds a credential's version key lives: longer than any in-process copy."""
    return 2 * protocol().credential_cache_seconds + 60


#: A credential's key never changes: parse and vet it (libsodium's point check) once per
#: process, not on every request. Refused keys raise and are not cached.
trusted_key = functools.lru_cache(maxsize=4096)(worker_public_key)


def resolve_credential(
    key_id: str, *, now: float, local: bool = False
) -> tuple[WorkerPrincipal, str, CredentialStamp | None]:
    """The principal, the stored public key (text) and — when ``local`` and the in-process layer
    exists — the :class:`CredentialStamp` whose version the caller must check after the
    request's nonce round trip (``api.auth``); raises as :func:`principal_for`."""
    stamp = None
    if local and _local_layer():
        credential, stamp = _load_credential_locally(key_id)
    else:
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
    return principal, credential.public_key, stamp


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
    key = _SESSION_OWNER_KEY.format(session_id)
    cache.set(key, str(worker_id), timeout=SESSION_OWNER_CACHE_SECONDS)
    if _local_layer():
        _remember_locally(_LOCAL_OWNERS, cache.make_key(key), str(worker_id))


def session_owner(session_id: object) -> str | None:
    """The worker id (text) a session id belongs to, or None if it names no session (ADR-0012 §1).

    ``session_id``: anything a body or path carried; a value that is not a UUID string returns
    None (the serializer then refuses it by field). A cache hit runs no query; a miss runs one
    primary-key lookup and caches the answer, since a session never changes owner; with the
    in-process layer a known owner is answered from memory. Raises nothing but database errors.
    """
    try:
        parsed = uuid.UUID(str(session_id))
    except (TypeError, ValueError, AttributeError):
        return None
    key = _SESSION_OWNER_KEY.format(parsed)
    local = _local_layer()
    if local:
        owner = _LOCAL_OWNERS.get(cache.make_key(key))
        if owner is not None:
            return owner
    owner = cache.get(key)
    if owner is not None:
        if local:
            _remember_locally(_LOCAL_OWNERS, cache.make_key(key), owner)
        return owner
    found = WorkerSession.objects.filter(pk=parsed).values_list("worker_id", flat=True).first()
    if found is None:
        return None
    remember_session_owner(parsed, found)
    return str(found)
