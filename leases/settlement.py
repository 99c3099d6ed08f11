"""Settling run leases whose holder can no longer act (ADR-0012 §3, docs/leases.md, States).

The same rules apply whether a lease lapsed (expiry sweep or a claim's takeover), or its session
was replaced, expired, forced offline or its worker revoked:

* the lease is released with a reason, by a compare-and-swap that re-checks its state, lease
  generation (and, for expiry, its expiry against the database clock and the version the sweep
  observed) — zero rows changed means another transaction settled or renewed it first, and
  nothing else is written;
* an attempt that never started (``claimed``) goes back to the queue under the same attempt
  number and queue position (a dispatch timeout does not consume a try: the job never ran), or
  is cancelled with its run if the run has a cancellation request;
* an attempt that started (``starting``/``running``) is ``lost``; its run is reconciled in the
  same transaction by ``runs.outcomes.conclude_attempt`` (retry wait, failed or cancelled).

Helpers for write paths: they open no transaction. Callers hold the lease's worker row lock when
they have one; the run row is locked here (order worker → run → attempt → lease).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import F

from audit.recorder import record
from core.wakeups import work_ready
from runs.locks import lock_run
from runs.models import RunAttempt
from runs.outcomes import conclude_attempt
from runs.states import AttemptState, RunState
from runs.transitions import move_attempt, move_run, update_attempt
from workers.models import WorkerSession

from .models import LeaseState, ReleaseReason, RunDispatchLease

#: How a session's end maps onto the release reason of the leases it held.
SESSION_END_REASONS = {
    "superseded": ReleaseReason.SESSION_REPLACED,
    "revoked": ReleaseReason.WORKER_REVOKED,
    "re_enrolled": ReleaseReason.SESSION_REPLACED,  # the credential it signed with was replaced
    "session_expired": ReleaseReason.SESSION_EXPIRED,
    "session_offline": ReleaseReason.SESSION_OFFLINE,
}


def settle_lease(
    lease: RunDispatchLease,
    *,
    reason: str,
    now: datetime,
    actor_type: str,
    actor: str = "",
    expired_only: bool = False,
    observed_version: int | None = None,
    lapsed_by: datetime | None = None,
) -> bool:
    """Release ``lease`` and settle its attempt and run; return False if the CAS changed nothing.

    Arguments: ``lease`` as read (possibly stale; only its id, generation, worker, session, run
    and attempt ids are trusted), ``reason`` a :class:`ReleaseReason`, ``now`` the DB clock read
    after the caller's locks, the actor for the events. ``expired_only`` adds ``expires_at <= now``
    to the CAS (expiry sweep, claim takeover; ``lapsed_by`` instead of ``now`` when given: the
    sweep's ``audit.liveness.expiry_cutoff``); ``observed_version`` adds ``version = observed`` (a
    sweep must not undo a renewal that landed after it looked). For a lapsed unstarted attempt the
    recorded reason is ``dispatch_timeout`` and for a lapsed started one ``lease_expired``.

    Locks: the run row (the caller holds the lease's worker row, or — claim takeover — its own).
    Writes, only if the lease CAS hits: lease ``released`` (version + 1, ``ended_at``),
    ``lease.released``, then the attempt and run as the module docstring says, with their events.
    Raises ``invalid_run_transition``/``run_version_conflict`` only on a broken invariant.
    docs/leases.md, States, §2 (cancel first); ADR-0012 §3.
    """
    run = lock_run(lease.run_id)
    attempt = RunAttempt.objects.get(pk=lease.attempt_id)
    started = attempt.state in (AttemptState.STARTING, AttemptState.RUNNING)
    if expired_only:
        reason = ReleaseReason.LEASE_EXPIRED if started else ReleaseReason.DISPATCH_TIMEOUT
    cas = RunDispatchLease.objects.filter(
        pk=lease.pk, state=LeaseState.LEASED, lease_generation=lease.lease_generation
    )
    if expired_only:
        cas = cas.filter(expires_at__lte=lapsed_by or now)
    if observed_version is not None:
        cas = cas.filter(version=observed_version)
    if not cas.update(
        state=LeaseState.RELEASED, release_reason=reason, ended_at=now, version=F("version") + 1
    ):
        return False
    record(
        "lease.released",
        actor_type=actor_type,
        actor=actor,
        worker_id=lease.worker_id,
        session_id=lease.session_id,
        run_id=lease.run_id,
        attempt_id=lease.attempt_id,
        lease_id=lease.pk,
        data={"reason": reason, "lease_generation": lease.lease_generation, "started": started},
    )
    if attempt.lease_generation != lease.lease_generation or attempt.state not in (
        AttemptState.CLAIMED,
        AttemptState.STARTING,
        AttemptState.RUNNING,
    ):
        return True  # an older generation, or the attempt already ended: only authority is revoked
    if started:
        conclude_attempt(
            run,
            attempt,
            AttemptState.LOST,
            now=now,
            actor_type=actor_type,
            actor=actor,
            reason=reason,
            lease_expires_at=lease.expires_at,
        )
    elif run.cancel_requested_at is not None:
        move_attempt(
            attempt,
            AttemptState.CANCELLED,
            actor_type=actor_type,
            actor=actor,
            finished_at=now,
            outcome_reason="cancelled_by_user",
        )
        move_run(
            run,
            RunState.CANCELLED,
            actor_type=actor_type,
            actor=actor,
            finished_at=now,
            error_class="cancelled_by_user",
        )
    else:
        update_attempt(attempt, lease_expires_at=None, worker=None, session_id=None)
        work_ready(attempt.placement_sha256)  # back in the queue: wake a waiter that can run it
    return True


def settle_session_leases(
    session: WorkerSession, *, reason: str, now: datetime, actor_type: str, actor: str = ""
) -> int:
    """Settle every active lease of an ended session (its worker row is locked by the caller).

    Called in the same transaction that replaces, fences (revocation), expires or forces offline
    the session, so the session's end and its leases' settlement commit together (ADR-0012 §2–§3,
    docs/transport.md §5). ``reason`` is the session's end reason (see
    :data:`SESSION_END_REASONS`). Leases are settled in run-id order so that run locks follow one
    order. Returns how many were settled.
    """
    release_reason = SESSION_END_REASONS[reason]
    leases = RunDispatchLease.objects.filter(session_id=session.pk, state=LeaseState.LEASED).order_by(
        "run_id"
    )
    return sum(
        settle_lease(lease, reason=release_reason, now=now, actor_type=actor_type, actor=actor)
        for lease in leases
    )


def release_expired_lease_of(attempt: RunAttempt, *, now: datetime, actor_type: str, actor: str = "") -> None:
    """Release a lapsed (unswept) lease of an unstarted attempt that is being cancelled.

    The caller (``actions.runs.run_cancel``) holds the run lock and ends the attempt itself; this
    only revokes the lease, by a CAS that re-checks state and expiry (a live lease is untouched:
    its worker learns of the cancellation instead).
    """
    RunDispatchLease.objects.filter(
        attempt_id=attempt.pk, state=LeaseState.LEASED, expires_at__lte=now
    ).update(
        state=LeaseState.RELEASED,
        release_reason=ReleaseReason.CANCELLED,
        ended_at=now,
        version=F("version") + 1,
    )
