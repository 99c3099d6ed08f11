"""The lease fence every call on an existing run lease passes (ADR-0012 §3, ``docs/leases.md``).

:func:`fence_lease` locks the worker row, reads the database clock after the lock, passes the
session fence (``workers.fence``), then locks the run row (global order: worker → run → attempt →
lease, ``workers.locks``) and checks the lease's identity: the presented token against the stored
digest (constant time), the lease generation, and the session and generation that claimed it.
State and expiry are checked by :func:`require_active`, version by :func:`check_lease_version`;
lease writes go through :func:`lease_cas`, which aborts with a conflict code on a miss (under
the locks above a miss means the locking discipline was broken). Nothing here writes on refusal.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F

from audit.liveness import lapse_excused
from core.conf import protocol
from core.errors import DomainError
from leases.models import LeaseState, RunDispatchLease
from leases.tokens import token_matches
from runs.locks import lock_run
from runs.models import Run, RunAttempt
from workers.fence import Purpose, lock_and_fence, read_and_fence
from workers.models import Worker, WorkerSession


@dataclass
class LeaseFence:
    """A lease call that passed both fences: the locked rows and the database clock."""

    worker: Worker
    session: WorkerSession
    lease: RunDispatchLease
    run: Run
    attempt: RunAttempt
    now: datetime


def require_active(lease: RunDispatchLease, now: datetime, field: str | None = None) -> None:
    """Refuse a lease that completed, was released or lapsed by ``now`` (the database clock).

    A lease that lapsed during an outage of the control plane is not refused while the grace
    window after it is open (``audit.liveness.lapse_excused``). Raises ``lease_completed``,
    ``lease_released`` (``details.reason``) or ``lease_expired``, naming ``field`` when given."""
    if lease.state == LeaseState.COMPLETED:
        raise DomainError("lease_completed", "the run lease already completed", field=field)
    if lease.state == LeaseState.RELEASED:
        raise DomainError(
            "lease_released",
            f"the run lease was released ({lease.release_reason})",
            field=field,
            details={"reason": lease.release_reason},
        )
    if not lapse_excused(lease.expires_at, now):
        # A lease that lapsed during an outage of the control plane stays renewable for the
        # grace window after it serves again (audit.liveness; docs/leases.md, Outages).
        raise DomainError("lease_expired", "the run lease lapsed", field=field)


def fence_lease(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    attempt_id: uuid.UUID,
    lease_generation: int,
    lease_token: str,
    lock_worker: bool = True,
) -> LeaseFence:
    """Lock worker then run, and pass the session fence and the lease's identity fence.

    ``lock_worker=False`` (live log chunks, docs/logs.md; artifact parts lock it) reads the worker
    row instead of locking it (``workers.fence.read_and_fence``): the run row lock, taken by
    every lease settlement too, and the lease state read under it decide.

    Arguments: the session fence (``session_id``, ``generation``) and the lease fence
    (``attempt_id``, ``lease_generation`` ≥ 1, ``lease_token``). State and expiry are left to
    the caller (a completed lease may answer an exact replay). Raises the session fence codes,
    ``lease_unknown``, ``lease_generation_mismatch``, ``lease_token_mismatch``,
    ``lease_session_mismatch``.
    """
    if lock_worker:
        fenced = lock_and_fence(
            worker_id=worker_id,
            session_id=session_id,
            generation=generation,
            expected_version=None,
            purpose=Purpose.LEASE,
        )
    else:
        fenced = read_and_fence(
            worker_id=worker_id, session_id=session_id, generation=generation, purpose=Purpose.LEASE
        )
    worker, session, now = fenced.worker, fenced.session, fenced.now
    lease = RunDispatchLease.objects.filter(
        worker_id=worker.pk, attempt_id=attempt_id, lease_generation=lease_generation
    ).first()
    if lease is None:
        if RunDispatchLease.objects.filter(attempt_id=attempt_id, worker_id=worker.pk).exists():
            raise DomainError(
                "lease_generation_mismatch", "no lease of this generation", field="leaseGeneration"
            )
        raise DomainError("lease_unknown", "no such run lease for this worker", field="attemptId")
    run = lock_run(lease.run_id)
    lease.refresh_from_db()
    if not token_matches(lease_token, lease.token_digest, worker_id=worker.pk):
        raise DomainError("lease_token_mismatch", "the lease token does not match", field="leaseToken")
    if lease.session_id != session.pk or lease.session_generation != generation:
        raise DomainError("lease_session_mismatch", "the lease belongs to another session", field="sessionId")
    attempt = RunAttempt.objects.get(pk=lease.attempt_id)
    run.revision  # noqa: B018 - load the pinned revision once, for outcome decisions
    return LeaseFence(worker=worker, session=session, lease=lease, run=run, attempt=attempt, now=now)


def lease_cas(lease: RunDispatchLease, what: str, *, bump: bool = False, **fields) -> None:
    """Write ``fields`` on an active lease only if it is still the lease this transaction read
    (state, version, unexpired); raise ``lease_version_conflict`` if it is not."""
    if bump:
        fields["version"] = F("version") + 1
    changed = RunDispatchLease.objects.filter(
        pk=lease.pk, state=LeaseState.LEASED, version=lease.version, expires_at=lease.expires_at
    ).update(**fields)
    if changed != 1:
        raise DomainError("lease_version_conflict", f"the lease changed under {what}", field="leaseVersion")


def check_lease_version(lease: RunDispatchLease, expected: int) -> None:
    """Refuse a call that presents another lease version (``lease_version_conflict``, with
    ``details.currentVersion``)."""
    if lease.version != expected:
        raise DomainError(
            "lease_version_conflict",
            f"expected lease version {expected}, the lease is at {lease.version}",
            field="leaseVersion",
            details={"currentVersion": lease.version},
        )


@dataclass(frozen=True)
class AckResult:
    """Answer to starting/running ACKs and renewals."""

    status: str
    lease: RunDispatchLease
    cancel_requested: bool
    renew_interval_seconds: int


def renew_interval() -> int:
    """Workers renew at the lease's midpoint, at least every second."""
    return max(1, protocol().run_lease_seconds // 2)
