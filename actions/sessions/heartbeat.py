"""Heartbeat: keep a session alive and report free capacity (ADR-0012 §3, §5; ``docs/sessions.md`` Heartbeat
cost)."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import F
from django.db.models.functions import Now

from audit.liveness import expiry_cutoff
from core.db import db_now, write_path
from core.errors import DomainError
from leases.selectors import cancel_requested_attempt_ids
from workers.fence import Purpose, check_session, lock_and_fence
from workers.models import LIVE_SESSION_STATES, SessionState, Worker, WorkerSession
from workers.sessions import (
    SessionView,
    session_lease_ttl,
)


def _effective_slots(session: WorkerSession, available_slots: int) -> int:
    """A draining session has no capacity whatever the worker reports."""
    return 0 if session.state == SessionState.DRAINING else available_slots


def _lease_needs_extension(session: WorkerSession, now: datetime) -> bool:
    """The write rule's first half: extend only once the lease has used more than half its TTL."""
    return session.lease_expires_at - now < session_lease_ttl() / 2


def _heartbeat_needs_write(session: WorkerSession, available_slots: int, now: datetime) -> bool:
    return (
        _lease_needs_extension(session, now)
        or _effective_slots(session, available_slots) != session.available_slots
    )


def session_heartbeat(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int,
    available_slots: int,
) -> SessionView:
    """Keep a session alive and report its free capacity (ADR-0012 §3, §5).

    Arguments: the fence (``session_id``, ``generation`` ≥ 1, ``expected_version`` ≥ 0) and
    ``available_slots`` (0 – the session's ``max_concurrent_runs``).

    Write rule (docs/sessions.md "Heartbeat cost"): the session row is written only when
    (a) the lease has used more than half its TTL — then it is extended to DB now + TTL, the
    version unchanged — or (b) the effective ``available_slots`` changed — then they are stored
    and the version goes up by one. Any other heartbeat is a pure read: one statement reads the
    session, its worker and the database clock, the fence is checked, nothing is written. A
    draining session's capacity stays 0 whatever is reported. A write runs as its own
    transaction (``_heartbeat_write``) that locks the worker, re-reads and re-fences, so a
    heartbeat racing a replacement either lands first or is fenced — it never revives a session.

    Raises: every ``fence_session`` code, ``slots_exceed_maximum``, ``storage_busy``,
    ``lock_timeout``.
    """

    session = (
        WorkerSession.objects.select_related("worker")
        .annotate(db_now=Now())
        .filter(pk=session_id, worker_id=worker_id)
        .first()
    )
    if session is None:  # refused: revoked worker, or no such session for this worker (fence order)
        worker = Worker.objects.filter(pk=worker_id).first()
        if worker is None:
            raise DomainError("worker_not_found", "no such worker")
        check_session(
            worker,
            None,
            generation=generation,
            expected_version=expected_version,
            now=db_now(),
            purpose=Purpose.HEARTBEAT,
        )
        raise AssertionError("check_session accepts no missing session")
    now = session.db_now
    check_session(
        session.worker,
        session,
        generation=generation,
        expected_version=expected_version,
        now=now,
        purpose=Purpose.HEARTBEAT,
    )
    if available_slots > session.max_concurrent_runs:
        raise DomainError(
            "slots_exceed_maximum",
            f"availableSlots {available_slots} is above maxConcurrentRuns {session.max_concurrent_runs}",
            field="availableSlots",
        )
    view = SessionView(session=session, server_time=now)
    if _heartbeat_needs_write(session, available_slots, now):
        view = _heartbeat_write(
            worker_id=worker_id,
            session_id=session_id,
            generation=generation,
            expected_version=expected_version,
            available_slots=available_slots,
        )
    return SessionView(
        session=view.session,
        server_time=view.server_time,
        cancel_requested=tuple(cancel_requested_attempt_ids(session_id)),
        rotation_required=session.worker.rotation_required,
    )


@write_path
def _heartbeat_write(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int,
    available_slots: int,
) -> SessionView:
    """The heartbeat's write, under the worker lock: extend the lease and/or store new slots."""
    fenced = lock_and_fence(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        expected_version=expected_version,
        purpose=Purpose.HEARTBEAT,
    )
    session, now = fenced.session, fenced.now
    slots = _effective_slots(session, available_slots)
    updates: dict[str, object] = {}
    if _lease_needs_extension(session, now):
        updates["lease_expires_at"] = now + session_lease_ttl()
    if slots != session.available_slots:
        updates["available_slots"] = slots
        updates["version"] = F("version") + 1
    if updates:
        # The fence is in the WHERE clause too: a lapsed or ended session is never extended
        # (a lapse excused by an outage of the control plane is not a lapse: audit.liveness).
        changed = WorkerSession.objects.filter(
            pk=session.pk,
            generation=generation,
            version=expected_version,
            state__in=LIVE_SESSION_STATES,
            lease_expires_at__gt=expiry_cutoff(now) if session.lease_expires_at <= now else now,
        ).update(**updates)
        if changed != 1:
            raise DomainError(
                "session_version_conflict", "the session changed under the heartbeat", field="expectedVersion"
            )
        session.refresh_from_db()
    return SessionView(session=session, server_time=now)
