"""Run write paths: enqueue, cancel, an operator's retry, retry scheduling (``docs/leases.md``
Cancellation and Lost and retry; ``docs/operators.md``).


One public function per write path, each one transaction (``core.db.write_path``).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from audit.models import ActorType
from audit.recorder import record
from core.conf import protocol
from core.db import db_now, write_path
from core.errors import DomainError
from core.wakeups import work_ready, worker_changed
from leases.models import RunDispatchLease
from leases.settlement import release_expired_lease_of
from runs.locks import lock_run
from runs.models import Run, RunAttempt, TaskRevision
from runs.outcomes import LOST_RETRY_MARGIN
from runs.states import ATTEMPT_LIVE, RUN_TERMINAL, AttemptState, RunState
from runs.transitions import bump_run, move_attempt, move_run

log = logging.getLogger(__name__)


def _actor(user) -> str:
    return getattr(user, "username", "") or ""


def _new_attempt(run: Run, number: int, now: datetime, actor_type: str, actor: str) -> RunAttempt:
    attempt = RunAttempt.objects.create(
        run=run,
        number=number,
        state=AttemptState.CLAIMED,
        priority=run.priority,
        ready_at=now,
        created_at=now,
        placement_sha256=run.revision.placement_sha256,
    )
    work_ready(attempt.placement_sha256)  # on commit: wake a waiting claim that can run it
    record(
        "attempt.claimed",
        actor_type=actor_type,
        actor=actor,
        run_id=run.pk,
        attempt_id=attempt.pk,
        data={"number": number},
    )
    return attempt


@write_path
def run_enqueue(
    *,
    revision_id: uuid.UUID,
    priority: int = 0,
    actor_type: str = ActorType.OPERATOR,
    actor: str = "",
    role: str = "",
) -> Run:
    """Create a run pinned to ``revision_id`` and queue its first attempt (one transaction).

    ``priority`` −100…100, higher first. Writes the run (created → queued), attempt 1
    (``claimed``: owned by the queue, awaiting a lease) and the events ``run.created``,
    ``run.queued``, ``attempt.claimed``; ``run.created`` names the operator's ``role``.
    Raises ``revision_not_found``, ``validation_failed``.
    """
    revision = TaskRevision.objects.filter(pk=revision_id).first()
    if revision is None:
        raise DomainError("revision_not_found", "no such task revision", field="revisionId")
    return enqueue_revision(
        revision=revision, priority=priority, actor_type=actor_type, actor=actor, created_data={"role": role}
    )


def enqueue_revision(
    *,
    revision: TaskRevision,
    priority: int,
    actor_type: str,
    actor: str,
    created_data: dict[str, Any] | None = None,
    retry_of: Run | None = None,
) -> Run:
    """The body of :func:`run_enqueue`, inside the caller's write path (it opens no transaction).

    For write paths that create a run as part of a larger act (a retry, ``run_retry``; a
    schedule's admission, ``actions.schedules``). ``created_data``: low-cardinality facts for the
    ``run.created`` event; ``retry_of``: the run this one retries. Raises ``validation_failed`` on
    ``priority`` outside −100…100.
    """
    if not -100 <= priority <= 100:
        raise DomainError("validation_failed", "must be between -100 and 100", field="priority")
    now = db_now()
    run = Run.objects.create(
        task_id=revision.task_id,
        revision=revision,
        priority=priority,
        created_at=now,
        created_by=actor[:150],
        retry_of=retry_of,
    )
    record(
        "run.created", actor_type=actor_type, actor=actor, run_id=run.pk, run_sequence=0, data=created_data
    )
    move_run(run, RunState.QUEUED, actor_type=actor_type, actor=actor, attempt_count=1)
    _new_attempt(run, 1, now, actor_type, actor)
    return run


def _lost_attempt_deadline(run: Run) -> datetime | None:
    """When the run's last attempt, if it was lost, can no longer be running on its worker."""
    last = RunAttempt.objects.filter(run=run).order_by("-number").first()
    if last is None or last.state != AttemptState.LOST:
        return None
    expired = (
        RunDispatchLease.objects.filter(attempt=last)
        .order_by("-expires_at")
        .values_list("expires_at", flat=True)
        .first()
    )
    if expired is None:
        return None
    return expired + timedelta(seconds=run.revision.effective_lost_after_seconds) + LOST_RETRY_MARGIN


@write_path
def run_retry(
    *, run_id: uuid.UUID, actor_type: str = ActorType.OPERATOR, actor: str = "", role: str = ""
) -> Run:
    """Operator: run a finished run again, as a new run linked to it (``retry_of``).

    The new run pins the same revision and priority and starts at attempt 1; the old run is not
    changed. Refused with ``run_not_finished`` while the run is not terminal (it has, or may yet
    get, a live attempt: cancel it first), and while its last attempt was lost and may still be
    running on its worker — before that lease's hard deadline (expiry + ``lost_after_seconds`` +
    ``LOST_RETRY_MARGIN``, docs/leases.md "Hard deadline"), as an automatic retry waits too.
    Locks: the old run's row (two retries of one run both
    succeed, one after the other, each a new run). Writes: the new run and its first attempt with
    their events, and ``run.retried`` on the old run naming the new one's actor and ``role``.
    Raises ``run_not_found``, ``run_not_finished``.
    """
    old = lock_run(run_id)
    if old.state not in RUN_TERMINAL or RunAttempt.objects.filter(run=old, state__in=ATTEMPT_LIVE).exists():
        raise DomainError("run_not_finished", f"the run is {old.state}; only a finished run can be retried")
    deadline = _lost_attempt_deadline(old)
    if deadline is not None and db_now() < deadline:
        raise DomainError(
            "run_not_finished",
            f"its last attempt was lost and may still be running on its worker until "
            f"{deadline.isoformat(timespec='seconds')} (the hard deadline); retry after that",
        )
    run = enqueue_revision(
        revision=old.revision,
        priority=old.priority,
        actor_type=actor_type,
        actor=actor,
        created_data={"role": role},
        retry_of=old,
    )
    record("run.retried", actor_type=actor_type, actor=actor, run_id=old.pk, data={"role": role})
    return run


@dataclass(frozen=True)
class CancelResult:
    run: Run
    #: "requested" (intent recorded now), "already_requested" or "already_terminal".
    status: str


@write_path
def run_cancel(
    *,
    run_id: uuid.UUID,
    reason: str = "",
    actor_type: str = ActorType.OPERATOR,
    actor: str = "",
    role: str = "",
) -> CancelResult:
    """Record a durable cancellation request for a run (docs/leases.md, Cancellation).

    The first request sets ``cancel_requested_at`` and appends ``run.cancel_requested``. An attempt
    that holds no active lease (queued, retry wait) is cancelled at once with its run. A leased
    attempt learns of it from its next renew/heartbeat/ACK answer; its worker stops the process
    and completes ``cancelled``. If that worker vanishes, lease settlement cancels instead of
    retrying. No new attempt is ever created for a cancel-requested run.

    Locks: the run row. Writes (first request only): ``cancel_requested_at`` = DB now, the
    reason, version + 1, ``run.cancel_requested``; for an unleased attempt also attempt and run
    ``cancelled`` with their events (a lapsed, unswept lease of it is released ``cancelled``).
    ``run.cancel_requested`` names the operator's ``role``.
    Returns the run and ``requested``/``already_requested``/``already_terminal``.
    Raises ``run_not_found``, ``validation_failed`` (reason over 200 characters).
    """
    if len(reason) > 200:
        raise DomainError("validation_failed", "at most 200 characters", field="reason")
    run = lock_run(run_id)
    if run.state in RUN_TERMINAL:
        return CancelResult(run, "already_terminal")
    if run.cancel_requested_at is not None:
        return CancelResult(run, "already_requested")
    now = db_now()
    bump_run(
        run,
        "run.cancel_requested",
        actor_type=actor_type,
        actor=actor,
        data={"role": role},
        cancel_requested_at=now,
        cancel_reason=reason,
    )
    live = RunAttempt.objects.filter(run=run, state__in=ATTEMPT_LIVE).first()
    unleased = (
        live is not None
        and live.state == AttemptState.CLAIMED
        and (live.lease_expires_at is None or live.lease_expires_at <= now)
    )
    if live is not None and not unleased and live.worker_id is not None:
        worker_changed(live.worker_id)  # on commit: the lease holder's waiting request answers it
    if live is None or unleased:
        if live is not None:
            release_expired_lease_of(live, now=now, actor_type=actor_type, actor=actor)
            move_attempt(
                live,
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
            next_attempt_at=None,
            error_class="cancelled_by_user",
        )
    return CancelResult(run, "requested")


@write_path
def run_requeue(*, run_id: uuid.UUID) -> Run | None:
    """When a ``retry_wait`` run is due: queue it with attempt N+1 (docs/leases.md, States — transaction 2).

    All or nothing: run → queued, ``attempt_count`` + 1, a new ``claimed`` attempt (which shares
    no worker, session, lease or handle with earlier ones), ``run.queued`` + ``attempt.claimed``.
    A run whose cancellation was requested meanwhile is cancelled instead. Locks: the run row;
    due-ness is re-checked against the DB clock after the lock. Returns None (writes nothing)
    if the run is not due or no longer waiting.
    """
    run = lock_run(run_id)
    now = db_now()
    if run.state != RunState.RETRY_WAIT or run.next_attempt_at is None or run.next_attempt_at > now:
        return None
    if run.cancel_requested_at is not None:
        return move_run(
            run,
            RunState.CANCELLED,
            actor_type=ActorType.RECONCILER,
            finished_at=now,
            next_attempt_at=None,
            error_class="cancelled_by_user",
        )
    number = run.attempt_count + 1
    move_run(
        run, RunState.QUEUED, actor_type=ActorType.RECONCILER, attempt_count=number, next_attempt_at=None
    )
    _new_attempt(run, number, now, ActorType.RECONCILER, "")
    return run


def sweep_due_retries(*, batch: int | None = None) -> int:
    """Requeue up to ``batch`` (default ``SWEEP_BATCH``) due ``retry_wait`` runs, one transaction
    each, oldest due first (partial index ``run_retry_due``); return how many were queued. Safe
    with several sweepers: each requeue re-checks under the run lock."""
    now = db_now()
    due = list(
        Run.objects.filter(state=RunState.RETRY_WAIT, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[: batch or protocol().sweep_batch]
    )
    queued = 0
    for run_id in due:
        try:
            queued += run_requeue(run_id=run_id) is not None
        except DomainError as exc:
            if exc.code not in ("lock_timeout", "storage_busy"):
                raise
            log.warning("run %s not requeued this cycle: %s", run_id, exc.code)  # the next cycle retries
    return queued
