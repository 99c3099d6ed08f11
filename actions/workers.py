"""Operator acts on a worker: revoke, drain, undrain (ADR-0012 §1, §5; ``docs/sessions.md``).

Revocation kills credentials, fences the live session and settles its leases in one transaction.
"""

from __future__ import annotations

import uuid

from django.db.models import F, Q

from actions.sessions.endings import fence_live_session
from audit.models import ActorType
from audit.recorder import record
from core.db import db_now, write_path
from workers.credentials import (
    forget_credentials_on_commit,
)
from workers.locks import lock_worker
from workers.models import (
    CredentialState,
    EnrollmentToken,
    SessionState,
    Worker,
    WorkerCredential,
    WorkerSession,
    WorkerState,
)


@write_path
def worker_revoke(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator: revoke a worker for good (ADR-0012 §1, docs/transport.md §5).

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
        WorkerCredential.objects.filter(worker=worker)
        .exclude(state=CredentialState.REVOKED)
        .values_list("pk", flat=True)
    )
    WorkerCredential.objects.filter(pk__in=ids).update(
        state=CredentialState.REVOKED, revoked_at=now, revoke_reason="worker_revoked"
    )
    Worker.objects.filter(pk=worker.pk).update(state=WorkerState.REVOKED, revoked_at=now)
    worker.refresh_from_db()
    fence_live_session(worker, reason="revoked", now=now, actor_type=ActorType.OPERATOR, actor=actor)
    EnrollmentToken.objects.filter(worker=worker, used_at__isnull=True).update(expires_at=now)
    record(
        "worker.revoked",
        actor_type=ActorType.OPERATOR,
        actor=actor,
        worker_id=worker.pk,
        data={"credentials": len(ids)},
    )
    forget_credentials_on_commit(ids)
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
        record(
            "session.drained",
            actor_type=ActorType.OPERATOR,
            actor=actor,
            worker_id=worker.pk,
            session_id=session.pk,
            data={"generation": session.generation, "by": "operator"},
        )
    record("worker.drained", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk)
    worker.refresh_from_db()
    return worker


@write_path
def worker_undrain(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator: end an operator drain (ADR-0012 §5). A session the operator drained returns to
    ``online`` (capacity 0 until its next heartbeat reports slots, version + 1); a worker's own
    shutdown drain stays. Locks: the worker row. Writes: the worker, its session,
    ``session.undrained`` (if one returned online) and ``worker.undrained`` events. A worker not draining is
    returned unchanged.
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
        record(
            "session.undrained",
            actor_type=ActorType.OPERATOR,
            actor=actor,
            worker_id=worker.pk,
            session_id=session.pk,
            data={"generation": session.generation},
        )
    record("worker.undrained", actor_type=ActorType.OPERATOR, actor=actor, worker_id=worker.pk)
    worker.refresh_from_db()
    return worker
