"""Worker identity: create a worker, issue an enrollment token, enroll a key (ADR-0012 §1;
``docs/transport.md``).

An operator creates a worker and a single-use, expiring enrollment token (shown once, stored as
a SHA-256 digest). The agent generates an Ed25519 key pair locally and exchanges the token and
its *public* key for a credential; every later request is signed with the private key
(``protocol.signing``). Re-enrolling a worker revokes its previous credentials and fences the
session of the process that held them.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.utils.text import slugify

from actions.sessions.endings import fence_live_session
from audit.models import ActorType
from audit.recorder import record
from core.conf import protocol
from core.db import Refusal, db_now, write_path
from core.errors import DomainError
from protocol.signing import public_key_text
from workers.credentials import (
    TOKEN_PREFIX,
    forget_credentials_on_commit,
    key_in_use,
    new_credential,
    token_digest,
)
from workers.keys import worker_public_key
from workers.locks import lock_worker
from workers.models import (
    CredentialState,
    EnrollmentToken,
    Worker,
    WorkerCredential,
    WorkerState,
)


@write_path
def worker_create(*, name: str, description: str = "", actor: str = "") -> Worker:
    """Create a worker record, with no credential yet (ADR-0012 §1: enrollment comes next).

    ``name``: a lowercase slug of at most 64 characters, unique; ``description``: free text,
    cut at 200 characters; ``actor``: the operator's name for the audit trail.
    Writes the worker row and a ``worker.created`` event.
    Raises ``validation_failed`` (field ``name``: not a slug, too long, or taken).
    """

    if not name or slugify(name) != name or len(name) > 64:
        raise DomainError(
            "validation_failed", "must be a lowercase slug of at most 64 characters", field="name"
        )
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
def enrollment_token_create(
    *, worker_id: uuid.UUID, ttl_seconds: int | None = None, user=None
) -> IssuedToken:
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
    record(
        "enrollment.token_issued",
        actor_type=ActorType.OPERATOR,
        actor=getattr(user, "username", ""),
        worker_id=worker.pk,
        data={"ttl_s": ttl},
    )
    return IssuedToken(token=token, record=issued)


def _refuse_enrollment(code: str, message: str, worker_id: uuid.UUID | None, client: str) -> Refusal:
    record(
        "enrollment.refused",
        actor_type=ActorType.WORKER,
        actor=client,
        worker_id=worker_id,
        data={"code": code},
    )
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
        return _refuse_enrollment(
            "enrollment_token_used", "the enrollment token was already used", worker.pk, client
        )
    if issued.expires_at <= now:
        return _refuse_enrollment(
            "enrollment_token_expired", "the enrollment token expired", worker.pk, client
        )
    if key_in_use(public_key):
        raise DomainError("validation_failed", "this key was already used by a credential", field="publicKey")
    previous = list(
        WorkerCredential.objects.filter(worker=worker)
        .exclude(state=CredentialState.REVOKED)
        .values_list("pk", flat=True)
    )
    WorkerCredential.objects.filter(pk__in=previous).update(
        state=CredentialState.REVOKED, revoked_at=now, revoke_reason="re_enrolled"
    )
    credential = new_credential(worker, public_key, key, now)
    EnrollmentToken.objects.filter(pk=issued.pk, used_at__isnull=True).update(
        used_at=now, used_by_credential=credential.pk
    )
    Worker.objects.filter(pk=worker.pk).update(rotation_required=False)
    # The process that held the old key can no longer sign a single call: end its session now,
    # rather than when its lease lapses, so that its run leases are settled at once.
    fenced = fence_live_session(
        worker, reason="re_enrolled", now=now, actor_type=ActorType.WORKER, actor=client
    )
    record(
        "worker.enrolled",
        actor_type=ActorType.WORKER,
        actor=client,
        worker_id=worker.pk,
        data={"revoked_credentials": len(previous), "fenced_session": fenced is not None},
    )
    forget_credentials_on_commit(previous)
    return credential
