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

from django.db import transaction
from django.db.models import F, Q

from audit.models import ActorType
from audit.recorder import record
from protocol.ids import uuid7
from protocol.signing import load_public_key
from qinglong.conf import protocol
from qinglong.db import Refusal, db_now, write_path
from qinglong.errors import DomainError

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


def _forget_credentials_on_commit(credential_ids: list[str]) -> None:
    from ..auth import forget_credentials

    transaction.on_commit(lambda: forget_credentials(credential_ids))


@write_path
def worker_create(*, name: str, description: str = "", actor: str = "") -> Worker:
    """Create a worker record (no credential yet). ``name``: slug ≤64. Raises ``validation_failed``."""
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
    """Issue a single-use enrollment token for one worker, valid ``ttl_seconds`` (default 24 h).

    Raises ``worker_not_found``, ``worker_revoked``, ``validation_failed`` (ttl outside 60 s–30 d).
    """
    ttl = ttl_seconds or protocol().enrollment_token_ttl_seconds
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
    """Exchange an enrollment token and an Ed25519 public key for a worker credential.

    ``public_key``: raw 32-byte key, base64url. ``worker_name``: if given, must be the token's
    worker. The token is single use; its worker's previous credentials are revoked (re-enrolling
    invalidates them). Refusals are audited (``enrollment.refused``) and raise
    ``enrollment_token_invalid`` (unknown, or another worker's), ``enrollment_token_used``,
    ``enrollment_token_expired``, ``worker_revoked``; a malformed key is ``validation_failed``.
    """
    key = load_public_key(public_key)
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
    record("worker.enrolled", actor_type=ActorType.WORKER, actor=client, worker_id=worker.pk,
           data={"revoked_credentials": len(previous)})
    _forget_credentials_on_commit(previous)
    return credential


def _new_credential(worker: Worker, public_key: str, key, now) -> WorkerCredential:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return WorkerCredential.objects.create(
        id="wkc_" + uuid7().hex,
        worker=worker,
        public_key=public_key,
        fingerprint=hashlib.sha256(raw).hexdigest(),
        state=CredentialState.ACTIVE,
        created_at=now,
    )


@dataclass(frozen=True)
class Rotation:
    """A completed rotation: the new credential, and when the previous key stops working."""

    credential: WorkerCredential
    previous_valid_until: datetime


@write_path
def credential_rotate(*, worker_id: uuid.UUID, credential_id: str, public_key: str) -> Rotation:
    """Install a new public key for a worker; the calling (current) key enters its grace period.

    Must be called with a request signed by the worker's *active* credential ``credential_id``.
    The old key keeps working until now + ``ROTATION_GRACE_SECONDS``, then it is refused with
    ``credential_expired``. Raises ``credential_revoked`` if the signing key is not the active one,
    ``validation_failed`` for a malformed or reused key.
    """
    key = load_public_key(public_key)
    worker = lock_worker(worker_id)
    now = db_now()
    current = WorkerCredential.objects.filter(pk=credential_id, worker=worker, state=CredentialState.ACTIVE).first()
    if current is None:
        raise DomainError("credential_revoked", "only the active credential can rotate")
    if current.public_key == public_key:
        raise DomainError("validation_failed", "the new key must differ from the current one", field="publicKey")
    grace = protocol().rotation_grace_seconds
    valid_until = now + timedelta(seconds=grace)
    WorkerCredential.objects.filter(pk=current.pk).update(state=CredentialState.ROTATED, not_after=valid_until)
    credential = _new_credential(worker, public_key, key, now)
    Worker.objects.filter(pk=worker.pk).update(rotation_required=False)
    record("credential.rotated", actor_type=ActorType.WORKER, worker_id=worker.pk, data={"grace_s": grace})
    _forget_credentials_on_commit([current.pk])
    return Rotation(credential=credential, previous_valid_until=valid_until)


@write_path
def credential_force_rotation(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator: require the worker to rotate its key within the grace period.

    The active credential becomes ``rotated`` with ``not_after`` = now + grace; the worker is told
    (``rotationRequired`` in heartbeat answers) and rotates with that key. A worker that misses
    the window gets ``credential_expired`` and must be re-enrolled.
    """
    worker = lock_worker(worker_id)
    now = db_now()
    grace = protocol().rotation_grace_seconds
    ids = list(
        WorkerCredential.objects.filter(worker=worker, state=CredentialState.ACTIVE).values_list("pk", flat=True)
    )
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
    its leases settled (started attempts lost and retried per policy elsewhere, unstarted ones
    back in the queue), events. The next request signed by it is refused (``credential_revoked``).
    Revoking a revoked worker is a no-op.
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
    transaction; running attempts finish normally. New sessions start draining.
    """
    worker = lock_worker(worker_id)
    if worker.state != WorkerState.ACTIVE:
        return worker
    now = db_now()
    Worker.objects.filter(pk=worker.pk).update(state=WorkerState.DRAINING, drain_requested_at=now)
    WorkerSession.objects.filter(worker=worker, state=SessionState.ONLINE).update(
        state=SessionState.DRAINING, drained_by="operator", available_slots=0, version=F("version") + 1
    )
    record("worker.drained", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk)
    worker.refresh_from_db()
    return worker


@write_path
def worker_undrain(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator: end an operator drain. A session the operator drained returns to ``online``
    (capacity 0 until its next heartbeat reports slots); a worker's own shutdown drain stays."""
    worker = lock_worker(worker_id)
    if worker.state != WorkerState.DRAINING:
        return worker
    Worker.objects.filter(pk=worker.pk).update(state=WorkerState.ACTIVE, drain_requested_at=None)
    WorkerSession.objects.filter(
        Q(worker=worker) & Q(state=SessionState.DRAINING) & Q(drained_by="operator")
    ).update(state=SessionState.ONLINE, drained_by="", version=F("version") + 1)
    record("worker.undrained", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk)
    worker.refresh_from_db()
    return worker

