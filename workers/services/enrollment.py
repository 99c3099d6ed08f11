"""Worker identity write paths: create, enroll, rotate, revoke, drain (ADR-0012 §1, §2).

An operator creates a worker and a single-use, expiring enrollment token (shown once, stored as
a SHA-256 digest). The agent generates an Ed25519 key pair locally and exchanges the token and
its *public* key for a credential; every later request is signed with the private key
(``protocol.signing``). Re-enrolling a worker revokes its previous credentials. A rotation,
signed by the current key, installs a new key and leaves the old one valid only for
``ROTATION_GRACE_SECONDS``. Revocation kills credentials, fences the live session and settles its
leases in one transaction. Every change evicts the credential cache once it commits.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Q

from audit.models import ActorType
from audit.recorder import record
from protocol.ids import uuid7
from protocol.signing import public_key_text
from qinglong.conf import protocol
from qinglong.db import Refusal, UniqueRace, db_now, is_unique_violation, write_path
from qinglong.errors import DomainError

from ..keys import worker_public_key
from ..locks import lock_worker
from ..models import (
    CredentialState,
    EnrollmentToken,
    SessionState,
    Worker,
    WorkerCredential,
    WorkerSession,
    WorkerState,
)
from .sessions import fence_live_session

TOKEN_PREFIX = "qlenroll_"


def token_digest(token: str) -> str:
    """SHA-256 (hex) of an enrollment token; the only form the database keeps."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _key_in_use(public_key: str) -> bool:
    """Whether any credential, live or dead, ever held this key (keys are never reused)."""
    return WorkerCredential.objects.filter(public_key=public_key).exists()


def _forget_credentials_on_commit(credential_ids: list[str]) -> None:
    from ..auth import forget_credentials

    transaction.on_commit(lambda: forget_credentials(credential_ids))


@write_path
def worker_create(*, name: str, description: str = "", actor: str = "") -> Worker:
    """Create a worker record, with no credential yet (ADR-0012 §1: enrollment comes next).

    ``name``: a lowercase slug of at most 64 characters, unique; ``description``: free text,
    cut at 200 characters; ``actor``: the operator's name for the audit trail.
    Writes the worker row and a ``worker.created`` event.
    Raises ``validation_failed`` (field ``name``: not a slug, too long, or taken).
    """
    from django.utils.text import slugify

    if not name or slugify(name) != name or len(name) > 64:
        raise DomainError("validation_failed", "must be a lowercase slug of at most 64 characters", field="name")
    if Worker.objects.filter(name=name).exists():
        raise DomainError("validation_failed", f"a worker named {name!r} exists", field="name")
    worker = Worker.objects.create(name=name, description=description[:200])
    record("worker.created", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk)
    return worker


@dataclass(frozen=True)
class IssuedToken:
    """A freshly issued enrollment token. ``token`` exists only here; show it once."""

    token: str
    record: EnrollmentToken


@write_path
def enrollment_token_create(*, worker_id: uuid.UUID, ttl_seconds: int | None = None, user=None) -> IssuedToken:
    """Issue a single-use enrollment token scoped to one worker (ADR-0012 §1, §2 takeover rule).

    ``ttl_seconds``: lifetime in seconds, 60 s to 30 days (default
    ``ENROLLMENT_TOKEN_TTL_SECONDS``, 24 h); ``user``: the operator issuing it, if any. The token
    (``qlenroll_`` + 256 random bits) exists only in the returned value — show it once; the
    database keeps its SHA-256. Earlier unused tokens of the worker stay valid until they expire.
    Locks: the worker row. Writes: the token row and an ``enrollment.token_issued`` event.
    Raises ``worker_not_found``, ``worker_revoked``, ``validation_failed`` (field ``ttlSeconds``).
    """
    ttl = protocol().enrollment_token_ttl_seconds if ttl_seconds is None else ttl_seconds
    if not 60 <= ttl <= 30 * 24 * 3600:
        raise DomainError("validation_failed", "must be between 60 seconds and 30 days", field="ttlSeconds")
    worker = lock_worker(worker_id)
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "a revoked worker cannot enroll again; create a new worker")
    now = db_now()
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    issued = EnrollmentToken.objects.create(
        worker=worker,
        digest=token_digest(token),
        created_by=user if getattr(user, "pk", None) else None,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl),
    )
    record("enrollment.token_issued", actor_type=ActorType.OPERATOR, actor=getattr(user, "username", ""),
           worker_id=worker.pk, data={"ttl_s": ttl})
    return IssuedToken(token=token, record=issued)


def _refuse_enrollment(code: str, message: str, worker_id: uuid.UUID | None, client: str) -> Refusal:
    record("enrollment.refused", actor_type=ActorType.WORKER, actor=client, worker_id=worker_id, data={"code": code})
    return Refusal(DomainError(code, message, field="token"))


@write_path
def worker_enroll(
    *, token: str, public_key: str, worker_name: str | None = None, client: str = ""
) -> WorkerCredential | Refusal:
    """Exchange an enrollment token and an Ed25519 public key for a worker credential (ADR-0012 §1).

    ``token``: the operator's single-use token; ``public_key``: the raw 32-byte key the agent
    generated, unpadded base64url (the private key never leaves the worker); ``worker_name``:
    if given, must be the token's worker; ``client``: the caller's address, for the audit trail.

    The token is single use and expires; its worker's previous credentials are revoked in the
    same transaction (re-enrolling invalidates them, and the cache forgets them on commit), and
    the live session of the process that held them is fenced with its leases settled.
    Locks: the worker row (so two racing uses of one token see exactly one winner). Writes: the
    credential, the token's use, revocations, the fenced session, ``worker.enrolled``. Refusals commit an
    ``enrollment.refused`` event and raise ``enrollment_token_invalid`` (unknown, or another
    worker's), ``enrollment_token_used``, ``enrollment_token_expired`` or ``worker_revoked``;
    a malformed or already used key raises ``validation_failed`` (field ``publicKey``).
    """
    key = worker_public_key(public_key)
    public_key = public_key_text(key)
    issued = EnrollmentToken.objects.filter(digest=token_digest(token)).select_related("worker").first()
    if issued is None:
        return _refuse_enrollment("enrollment_token_invalid", "unknown enrollment token", None, client)
    worker = lock_worker(issued.worker_id)
    now = db_now()
    issued.refresh_from_db()
    if worker_name is not None and worker_name != worker.name:
        return _refuse_enrollment(
            "enrollment_token_invalid", "the token belongs to another worker", worker.pk, client
        )
    if worker.state == WorkerState.REVOKED:
        return _refuse_enrollment("worker_revoked", "the worker is revoked", worker.pk, client)
    if issued.used_at is not None:
        return _refuse_enrollment("enrollment_token_used", "the enrollment token was already used", worker.pk, client)
    if issued.expires_at <= now:
        return _refuse_enrollment("enrollment_token_expired", "the enrollment token expired", worker.pk, client)
    if _key_in_use(public_key):
        raise DomainError("validation_failed", "this key was already used by a credential", field="publicKey")
    previous = list(
        WorkerCredential.objects.filter(worker=worker)
        .exclude(state=CredentialState.REVOKED)
        .values_list("pk", flat=True)
    )
    WorkerCredential.objects.filter(pk__in=previous).update(
        state=CredentialState.REVOKED, revoked_at=now, revoke_reason="re_enrolled"
    )
    credential = _new_credential(worker, public_key, key, now)
    EnrollmentToken.objects.filter(pk=issued.pk, used_at__isnull=True).update(
        used_at=now, used_by_credential=credential.pk
    )
    Worker.objects.filter(pk=worker.pk).update(rotation_required=False)
    # The process that held the old key can no longer sign a single call: end its session now,
    # rather than when its lease lapses, so that its run leases are settled at once.
    fenced = fence_live_session(worker, reason="re_enrolled", now=now, actor_type=ActorType.WORKER, actor=client)
    record("worker.enrolled", actor_type=ActorType.WORKER, actor=client, worker_id=worker.pk,
           data={"revoked_credentials": len(previous), "fenced_session": fenced is not None})
    _forget_credentials_on_commit(previous)
    return credential


def _new_credential(worker: Worker, public_key: str, key, now) -> WorkerCredential:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    try:
        return WorkerCredential.objects.create(
            id="wkc_" + uuid7().hex,
            worker=worker,
            public_key=public_key,
            fingerprint=hashlib.sha256(raw).hexdigest(),
            state=CredentialState.ACTIVE,
            created_at=now,
        )
    except IntegrityError as exc:
        # The same key enrolled for another worker at the same moment (the two transactions lock
        # different worker rows): the re-run sees it taken and refuses it by field.
        if is_unique_violation(exc):
            raise UniqueRace("public key inserted concurrently") from exc
        raise


@dataclass(frozen=True)
class Rotation:
    """A completed rotation: the new credential, and when the previous key stops working.

    ``replayed`` is True when the same rotation was asked for again (a lost answer): nothing
    was written and the answer is the first one's.
    """

    credential: WorkerCredential
    previous_valid_until: datetime
    replayed: bool = False


@write_path
def credential_rotate(*, worker_id: uuid.UUID, credential_id: str, public_key: str) -> Rotation:
    """Install a new public key for a worker, signed by its current key (ADR-0012 §2 takeover rule).

    Arguments: ``worker_id`` and ``credential_id`` come from the authenticated principal (the
    key that signed the request); ``public_key`` is the new raw 32-byte Ed25519 key, base64url.

    Only the worker's *newest* credential may rotate: the active one, or — after an operator
    forced a rotation (:func:`credential_force_rotation`) — the rotated one still inside its
    grace period, as long as nothing newer exists. The calling key then works only until
    now + ``ROTATION_GRACE_SECONDS`` (never longer than a grace it already had) and is refused
    with ``credential_expired`` afterwards. Asking again with the same new key from the key that
    rotated is an exact replay (a lost answer): same credential, nothing written.

    Locks: the worker row. Writes: the two credential rows, ``rotation_required`` cleared, a
    ``credential.rotated`` event; evicts the old key from the credential cache on commit.
    Raises: ``validation_failed`` (``publicKey`` malformed, or already used by any credential),
    ``worker_not_found``, ``worker_revoked``, ``credential_revoked``/``credential_expired``
    (the calling key is dead), ``credential_superseded`` (a newer credential exists).
    """
    key = worker_public_key(public_key)
    public_key = public_key_text(key)
    worker = lock_worker(worker_id)
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "the worker is revoked")
    now = db_now()
    live = list(
        WorkerCredential.objects.filter(worker=worker)
        .exclude(state=CredentialState.REVOKED)
        .order_by("-created_at", "-pk")
    )
    caller = next((credential for credential in live if credential.pk == credential_id), None)
    if caller is None:
        raise DomainError("credential_revoked", "the signing credential was revoked")
    if caller.state == CredentialState.ROTATED and caller.not_after <= now:
        raise DomainError("credential_expired", "the signing credential's grace period is over")
    newest = live[0]
    if newest.pk != caller.pk:
        if newest.public_key == public_key and live[1].pk == caller.pk:
            return Rotation(credential=newest, previous_valid_until=caller.not_after, replayed=True)
        raise DomainError(
            "credential_superseded", "a newer credential exists; only the newest key may rotate", field="publicKey"
        )
    if _key_in_use(public_key):
        raise DomainError("validation_failed", "this key was already used by a credential", field="publicKey")
    grace = protocol().rotation_grace_seconds
    valid_until = now + timedelta(seconds=grace)
    if caller.not_after is not None:
        valid_until = min(valid_until, caller.not_after)  # a forced rotation's grace is not extended
    WorkerCredential.objects.filter(pk=caller.pk).update(state=CredentialState.ROTATED, not_after=valid_until)
    credential = _new_credential(worker, public_key, key, now)
    Worker.objects.filter(pk=worker.pk).update(rotation_required=False)
    forced = caller.state == CredentialState.ROTATED
    record("credential.rotated", actor_type=ActorType.WORKER, actor=worker.name, worker_id=worker.pk,
           data={"grace_s": int((valid_until - now).total_seconds()), "forced": forced})
    _forget_credentials_on_commit([caller.pk])
    return Rotation(credential=credential, previous_valid_until=valid_until)


@write_path
def credential_force_rotation(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator: require the worker to rotate its key within the grace period (ADR-0012 §2).

    The active credential becomes ``rotated`` with ``not_after`` = now + ``ROTATION_GRACE_SECONDS``
    and the worker is flagged; the agent learns it from ``rotationRequired`` in its next
    heartbeat answer and rotates with that key (:func:`credential_rotate`). A worker that misses
    the window gets ``credential_expired`` and must be re-enrolled. Forcing again while a forced
    rotation is pending changes nothing.

    Locks: the worker row. Writes: the credential, the worker's flag, a
    ``credential.rotation_forced`` event; evicts the credential cache on commit.
    Raises: ``worker_not_found``, ``worker_revoked``, ``worker_not_enrolled`` (no active key).
    """
    worker = lock_worker(worker_id)
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "the worker is revoked")
    now = db_now()
    grace = protocol().rotation_grace_seconds
    ids = list(
        WorkerCredential.objects.filter(worker=worker, state=CredentialState.ACTIVE).values_list("pk", flat=True)
    )
    if not ids:
        if worker.rotation_required:
            return worker
        raise DomainError("worker_not_enrolled", "the worker has no active credential to rotate")
    WorkerCredential.objects.filter(pk__in=ids).update(
        state=CredentialState.ROTATED, not_after=now + timedelta(seconds=grace)
    )
    Worker.objects.filter(pk=worker.pk).update(rotation_required=True)
    record("credential.rotation_forced", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk,
           data={"grace_s": grace})
    _forget_credentials_on_commit(ids)
    worker.refresh_from_db()
    return worker


@write_path
def worker_revoke(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator: revoke a worker for good (ADR-0012 §1, PRODUCT invariant 11).

    In one transaction: worker → revoked, every credential revoked, the live session fenced,
    its leases settled by ``leases.settlement`` (started attempts lost and retried per policy
    elsewhere, unstarted ones back in the queue), unused enrollment tokens expired, events. On
    commit the credential cache forgets its keys in every process, so the next request signed by
    it is refused (``credential_revoked``); the agent then exits with status 4 and is not
    restarted. Revoking a revoked worker is a no-op. Locks: worker, then (via settlement) runs,
    attempts, leases. Raises ``worker_not_found``.
    """
    worker = lock_worker(worker_id)
    if worker.state == WorkerState.REVOKED:
        return worker
    now = db_now()
    ids = list(
        WorkerCredential.objects.filter(worker=worker).exclude(state=CredentialState.REVOKED).values_list("pk", flat=True)
    )
    WorkerCredential.objects.filter(pk__in=ids).update(
        state=CredentialState.REVOKED, revoked_at=now, revoke_reason="worker_revoked"
    )
    Worker.objects.filter(pk=worker.pk).update(state=WorkerState.REVOKED, revoked_at=now)
    worker.refresh_from_db()
    fence_live_session(worker, reason="revoked", now=now, actor_type=ActorType.OPERATOR, actor=actor)
    EnrollmentToken.objects.filter(worker=worker, used_at__isnull=True).update(expires_at=now)
    record("worker.revoked", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk,
           data={"credentials": len(ids)})
    _forget_credentials_on_commit(ids)
    return worker


@write_path
def worker_drain(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator drain: the worker takes no new runs, now and across restarts, until undrained.

    Its live online session turns ``draining`` (capacity 0, version + 1) in the same
    transaction; running attempts finish normally. New sessions start draining (ADR-0012 §5.3).
    Locks: the worker row. Writes: the worker, its session, ``session.drained`` (if a session was
    online) and ``worker.drained`` events. A worker
    that is not active is returned unchanged. Raises ``worker_not_found``.
    """
    worker = lock_worker(worker_id)
    if worker.state != WorkerState.ACTIVE:
        return worker
    now = db_now()
    Worker.objects.filter(pk=worker.pk).update(state=WorkerState.DRAINING, drain_requested_at=now)
    session = WorkerSession.objects.filter(worker=worker, state=SessionState.ONLINE).first()
    if session is not None:
        WorkerSession.objects.filter(pk=session.pk, state=SessionState.ONLINE).update(
            state=SessionState.DRAINING, drained_by="operator", available_slots=0, version=F("version") + 1
        )
        record("session.drained", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk,
               session_id=session.pk, data={"generation": session.generation, "by": "operator"})
    record("worker.drained", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk)
    worker.refresh_from_db()
    return worker


@write_path
def worker_undrain(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator: end an operator drain (ADR-0012 §5). A session the operator drained returns to
    ``online`` (capacity 0 until its next heartbeat reports slots, version + 1); a worker's own
    shutdown drain stays. Locks: the worker row. Writes: the worker, its session,
    ``session.undrained`` (if one returned online) and ``worker.undrained`` events. A worker not draining is returned unchanged.
    Raises ``worker_not_found``."""
    worker = lock_worker(worker_id)
    if worker.state != WorkerState.DRAINING:
        return worker
    Worker.objects.filter(pk=worker.pk).update(state=WorkerState.ACTIVE, drain_requested_at=None)
    session = WorkerSession.objects.filter(
        Q(worker=worker) & Q(state=SessionState.DRAINING) & Q(drained_by="operator")
    ).first()
    if session is not None:
        WorkerSession.objects.filter(pk=session.pk, state=SessionState.DRAINING).update(
            state=SessionState.ONLINE, drained_by="", version=F("version") + 1
        )
        record("session.undrained", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk,
               session_id=session.pk, data={"generation": session.generation})
    record("worker.undrained", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk)
    worker.refresh_from_db()
    return worker

