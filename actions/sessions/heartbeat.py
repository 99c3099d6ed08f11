"""Heartbeat: keep a session alive and report free capacity (ADR-0012 §3, §5; ``docs/sessions.md`` Heartbeat
cost)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import F
from django.db.models.functions import Now

from audit.liveness import expiry_cutoff
from core.db import db_now, prepared_row, write_path
from core.errors import DomainError
from leases.selectors import cancel_requested_attempt_ids
from workers.fence import Purpose, check_session, lock_and_fence, refence_after_miss
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

    PostgreSQL runs the whole heartbeat as one statement (:func:`_heartbeat_statement`); SQLite
    (one process, IMMEDIATE writers) keeps the read-then-locked-write path below.

    Raises: every ``fence_session`` code, ``slots_exceed_maximum``, ``storage_busy``,
    ``lock_timeout``.
    """
    if connection.vendor == "postgresql":
        return _heartbeat_statement(
            worker_id=worker_id,
            session_id=session_id,
            generation=generation,
            expected_version=expected_version,
            available_slots=available_slots,
        )

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
            refence_after_miss(
                fenced.worker,
                session,
                generation=generation,
                expected_version=expected_version,
                now=now,
                purpose=Purpose.HEARTBEAT,
                what="heartbeat",
            )
        session.refresh_from_db()
    return SessionView(session=session, server_time=now)


_SESSION_COLUMNS = [str(field.column) for field in WorkerSession._meta.concrete_fields]
_SESSION_ATTNAMES = [field.attname for field in WorkerSession._meta.concrete_fields]
_WORKER_COLUMNS = [str(field.column) for field in Worker._meta.concrete_fields]

#: The heartbeat in one round trip (PostgreSQL). ``cur`` reads the worker, its session and the
#: database clock from one snapshot; ``upd`` writes only when the write rule asks for it and only
#: while the row is exactly what ``cur`` read (any concurrent change — a replacement, a drain,
#: another heartbeat — makes it a miss, answered as ``session_version_conflict``, as the locked
#: compare-and-swap did) and the lease is still live by the clock read when the row is updated,
#: after any row-lock wait. The unchanged heartbeat matches no row: no lock, no row version, no
#: WAL. An extension changes only ``lease_expires_at`` (not indexed) in place: a HOT update.
#: The cancel list reads the session's active leases (``lease_active_session``) and each one's
#: run by key, and is sorted only afterwards: sorted in place, a plan made while the lease table
#: was nearly empty walked every active lease in attempt order (``one_active_lease_per_attempt``,
#: which yields that order) and kept doing so as the fleet grew — 20,082 buffers per heartbeat
#: against 11 (tests/plans/test_lease_function_plans.py).
#: Prepared once per connection (core.db.prepared_row), each parameter bound in the binary format
#: and cast to its type; the worker's integers are compared as ``numeric``, so a fence value past
#: the bigint range (the API allows 19 digits) matches no row and is refused with its fence code.
_HEARTBEAT_SQL = f"""
WITH cur AS (
    SELECT {", ".join(f"s.{c} AS s_{c}" for c in _SESSION_COLUMNS)},
           {", ".join(f"w.{c} AS w_{c}" for c in _WORKER_COLUMNS)},
           statement_timestamp() AS now
      FROM workers_worker w
      LEFT JOIN workers_workersession s ON s.id = %(session)b::uuid AND s.worker_id = w.id
     WHERE w.id = %(worker)b::uuid
), upd AS (
    UPDATE workers_workersession s
       SET lease_expires_at = CASE WHEN s.lease_expires_at - cur.now < %(half)b::interval
                                   THEN cur.now + %(ttl)b::interval ELSE s.lease_expires_at END,
           available_slots = %(slots)s,
           version = s.version + CASE WHEN %(slots)s <> s.available_slots THEN 1 ELSE 0 END
      FROM cur
     WHERE s.id = %(session)b::uuid AND s.worker_id = %(worker)b::uuid
       AND cur.w_state <> 'revoked'
       AND s.state IN ('online', 'draining') AND s.state = cur.s_state
       AND s.generation = %(generation)b::numeric
       AND s.version = %(version)b::numeric AND s.version = cur.s_version
       AND s.available_slots = cur.s_available_slots
       AND s.lease_expires_at = cur.s_lease_expires_at AND s.lease_expires_at > clock_timestamp()
       AND %(reported)b::numeric <= s.max_concurrent_runs
       AND (s.lease_expires_at - cur.now < %(half)b::interval OR %(slots)s <> s.available_slots)
    RETURNING s.version, s.available_slots, s.lease_expires_at
)
SELECT cur.*, upd.version, upd.available_slots, upd.lease_expires_at,
       ARRAY(SELECT x FROM unnest(ARRAY(
                SELECT l.attempt_id FROM leases_rundispatchlease l
                 WHERE l.session_id = %(session)b::uuid AND l.state = 'leased'
                   AND (SELECT r.cancel_requested_at FROM runs_run r WHERE r.id = l.run_id) IS NOT NULL
             )) AS x ORDER BY x)
  FROM cur LEFT JOIN upd ON true
""".replace(
    "%(slots)s",
    "(CASE WHEN s.state = 'draining' THEN 0 ELSE %(reported)b::numeric END)",  # effective slots
)
_SESSION_END = len(_SESSION_COLUMNS)
_WORKER_END = _SESSION_END + len(_WORKER_COLUMNS)


def _heartbeat_statement(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int,
    available_slots: int,
) -> SessionView:
    """PostgreSQL: the whole heartbeat as one statement (``_HEARTBEAT_SQL``), answered as on SQLite.

    The fence is checked in Python on the row the statement read (same codes, same order); the
    statement's write carries the same fence in its ``WHERE``, so a refused heartbeat never
    writes. The effective slots (0 while draining) are computed in SQL from the row's state.
    Raises the codes of :func:`session_heartbeat`. A write the rule asked for that missed (the
    row changed meanwhile) is retried by the locked path, ``_heartbeat_write``, which re-fences
    under the worker lock.
    """
    ttl = session_lease_ttl()
    params: dict[str, Any] = {
        "worker": worker_id,
        "session": session_id,
        "generation": generation,
        "version": expected_version,
        "reported": available_slots,
        "half": ttl / 2,
        "ttl": ttl,
    }
    row = prepared_row(_HEARTBEAT_SQL, params)
    if row is None:
        raise DomainError("worker_not_found", "no such worker")
    worker = Worker.from_db(connection.alias, _WORKER_COLUMNS, row[_SESSION_END:_WORKER_END])
    now = row[_WORKER_END]
    session = None
    if row[0] is not None:
        session = WorkerSession.from_db(connection.alias, _SESSION_ATTNAMES, row[:_SESSION_END])
    check_session(
        worker,
        session,
        generation=generation,
        expected_version=expected_version,
        now=now,
        purpose=Purpose.HEARTBEAT,
    )
    assert session is not None
    if available_slots > session.max_concurrent_runs:
        raise DomainError(
            "slots_exceed_maximum",
            f"availableSlots {available_slots} is above maxConcurrentRuns {session.max_concurrent_runs}",
            field="availableSlots",
        )
    version, slots, expires, cancel_requested = row[_WORKER_END + 1 :]
    view = SessionView(session=session, server_time=now)
    if version is not None:
        session.version, session.available_slots, session.lease_expires_at = version, slots, expires
    elif _heartbeat_needs_write(session, available_slots, now):
        # The row changed between the read and the write (a replacement, a drain, another
        # heartbeat): the locked path decides, exactly as before — it re-fences under the worker
        # lock (``session_superseded``, ``session_version_conflict``, …) or writes.
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
        cancel_requested=tuple(cancel_requested),
        rotation_required=worker.rotation_required,
    )


def session_keep_alive(*, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int) -> SessionView:
    """A waiting claim's heartbeat (docs/sessions.md, "Waiting claims keep the session alive").

    Fenced by session and generation like a claim (``Purpose.LEASE``: a draining session passes).
    The heartbeat's write rule without the slots: the lease is extended to DB now + TTL once it
    has used more than half its TTL, else this is a pure read; the version never changes, so a
    keep-alive never conflicts with a heartbeat or an operator's drain. While the claim waits,
    :func:`sessions_keep_alive` keeps the lease. Returns the session as a heartbeat answers it
    (cancellations, rotation).

    Raises: every ``fence_session`` code, ``storage_busy``, ``lock_timeout``.
    """
    session = (
        WorkerSession.objects.select_related("worker")
        .annotate(db_now=Now())
        .filter(pk=session_id, worker_id=worker_id)
        .first()
    )
    if session is None:
        worker = Worker.objects.filter(pk=worker_id).first()
        if worker is None:
            raise DomainError("worker_not_found", "no such worker")
        check_session(
            worker, None, generation=generation, expected_version=None, now=db_now(), purpose=Purpose.LEASE
        )
        raise AssertionError("check_session accepts no missing session")
    now = session.db_now
    check_session(
        session.worker, session, generation=generation, expected_version=None, now=now, purpose=Purpose.LEASE
    )
    view = SessionView(session=session, server_time=now)
    if _lease_needs_extension(session, now):
        view = _keep_alive_write(worker_id=worker_id, session_id=session_id, generation=generation)
    return SessionView(
        session=view.session,
        server_time=view.server_time,
        cancel_requested=tuple(cancel_requested_attempt_ids(session_id)),
        rotation_required=session.worker.rotation_required,
    )


@write_path
def _keep_alive_write(*, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int) -> SessionView:
    """The keep-alive's write, under the worker lock: extend the lease to DB now + TTL."""
    fenced = lock_and_fence(
        worker_id=worker_id,
        session_id=session_id,
        generation=generation,
        expected_version=None,
        purpose=Purpose.LEASE,
    )
    session, now = fenced.session, fenced.now
    # A lapse excused by an outage of the control plane is not a lapse (audit.liveness), as for
    # the heartbeat: the fence above let it through, the WHERE clause must agree.
    changed = WorkerSession.objects.filter(
        pk=session.pk,
        generation=generation,
        state__in=LIVE_SESSION_STATES,
        lease_expires_at__gt=expiry_cutoff(now) if session.lease_expires_at <= now else now,
    ).update(lease_expires_at=now + session_lease_ttl())
    if changed != 1:
        raise DomainError("session_expired", "the session lease lapsed", field="sessionId")
    session.refresh_from_db()
    return SessionView(session=session, server_time=now)


#: Session ids per statement of :func:`sessions_keep_alive` (SQLite bounds a statement's size).
KEEP_ALIVE_CHUNK = 500


@write_path
def sessions_keep_alive(*, sessions: list[tuple[uuid.UUID, int]], tick: float) -> int:
    """Keep the sessions of held waiting claims alive: one statement per 500 of them.

    ``sessions``: (session id, generation) of each waiting claim a server process holds (its
    worker is connected and waiting). Every session still live (online or draining), of that
    generation and not yet lapsed (or lapsed during an outage of the control plane, within its
    grace window: ``audit.liveness.expiry_cutoff``) is extended to DB now + TTL once less than TTL
    − ``tick`` seconds are left (``tick``: the caller's interval, so each call leaves nearly a full
    lease and an outage of the control plane starts with almost a whole TTL to ride out); an
    ended, replaced or lapsed one is never touched (the ``UPDATE … WHERE`` is the fence), nor its
    version. Called every half heartbeat interval by ``api.waiting``. Returns rows extended.
    """
    if not sessions:
        return 0
    now = db_now()
    cutoff = expiry_cutoff(now)  # a lapse excused by an outage is kept alive too (audit.liveness)
    margin = timedelta(seconds=min(max(0.0, tick), session_lease_ttl().total_seconds() / 2))
    by_generation: dict[int, list[uuid.UUID]] = {}
    for session_id, generation in sessions:
        by_generation.setdefault(generation, []).append(session_id)
    extended = 0
    for generation, ids in sorted(by_generation.items()):
        for start in range(0, len(ids), KEEP_ALIVE_CHUNK):
            extended += WorkerSession.objects.filter(
                pk__in=ids[start : start + KEEP_ALIVE_CHUNK],
                generation=generation,
                state__in=LIVE_SESSION_STATES,
                lease_expires_at__gt=cutoff,
                lease_expires_at__lt=now + session_lease_ttl() - margin,
            ).update(lease_expires_at=now + session_lease_ttl())
    return extended
