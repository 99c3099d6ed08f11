"""Session write paths: register, heartbeat, drain, offline, expiry (ADR-0012 §2, §3, §5, §6).

Each public write path is one transaction (``qinglong.db.write_path``) that locks the worker row
first (``workers.locks``), reads the database clock after the lock, passes the session fence
(``workers.fence``) and changes the session row with a compare-and-swap ``UPDATE``. Every state
change bumps the session's version and writes one event row in the same transaction. Refusals
write nothing, except the two the audit trail must show (a conflicting registration replay and a
rate-limited takeover), which commit their event and then raise.

The rules (the matrix of every call against every fault, the heartbeat write rule, timings per
profile, drain and offline) are in ``docs/sessions.md``.
"""

from __future__ import annotations

import hashlib
import math
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import rfc8785
from django.db import IntegrityError
from django.db.models import Count, F, Min
from django.db.models.functions import Now

from audit.models import ActorType, Event
from audit.recorder import record
from protocol.capabilities import CapabilitySnapshot
from protocol.ids import is_uuid7
from qinglong.conf import protocol
from qinglong.db import Refusal, UniqueRace, db_now, is_unique_violation, write_path
from qinglong.errors import DomainError

from ..fence import Purpose, check_session, fence_session
from ..locks import lock_worker, lock_worker_for_session
from ..models import LIVE_SESSION_STATES, SessionState, Worker, WorkerSession, WorkerState

MAX_CONCURRENT_RUNS = 256
#: The window the takeover limit counts replacements in (ADR-0012 §2, rejected alternative 6).
TAKEOVER_WINDOW = timedelta(minutes=1)


@dataclass(frozen=True)
class SessionView:
    """What a session call answers: the fence the worker must present next, and its timers."""

    session: WorkerSession
    server_time: datetime
    replaced_session: bool = False
    replayed: bool = False
    cancel_requested: tuple[uuid.UUID, ...] = ()
    #: The operator forced a key rotation; the agent rotates within the grace period.
    rotation_required: bool = False

    @property
    def heartbeat_interval_seconds(self) -> int:
        return protocol().heartbeat_interval_seconds

    @property
    def next_heartbeat_at(self) -> datetime:
        """Server time plus the heartbeat interval, jittered by ±HEARTBEAT_JITTER_RATIO."""
        settings = protocol()
        jitter = random.uniform(-settings.heartbeat_jitter_ratio, settings.heartbeat_jitter_ratio)
        return self.server_time + timedelta(seconds=settings.heartbeat_interval_seconds * (1 + jitter))


def registration_sha256(
    *, capabilities_sha256: str, max_concurrent_runs: int, software_version: str, protocol_version: int
) -> str:
    """SHA-256 (hex) of what a registration fixes for the session's life (ADR-0012 §2).

    Arguments: the canonical capability snapshot's SHA-256 (hex), ``max_concurrent_runs`` (1–256),
    ``software_version`` (≤64 printable ASCII), ``protocol_version`` (≥1), digested as RFC 8785
    JSON. Available slots are dynamic and not part of it, so a replay may report other slots.
    Pure; raises nothing.
    """
    content = {
        "capabilitiesSha256": capabilities_sha256,
        "maxConcurrentRuns": max_concurrent_runs,
        "softwareVersion": software_version,
        "protocolVersion": protocol_version,
    }
    return hashlib.sha256(rfc8785.dumps(content)).hexdigest()


def _check_slots(available_slots: int, max_concurrent_runs: int) -> None:
    if not 1 <= max_concurrent_runs <= MAX_CONCURRENT_RUNS:
        raise DomainError(
            "validation_failed", f"must be between 1 and {MAX_CONCURRENT_RUNS}", field="maxConcurrentRuns"
        )
    if not 0 <= available_slots <= max_concurrent_runs:
        raise DomainError(
            "slots_exceed_maximum",
            f"availableSlots {available_slots} is not within 0..maxConcurrentRuns {max_concurrent_runs}",
            field="availableSlots",
        )


def _lease_ttl() -> timedelta:
    return timedelta(seconds=protocol().session_lease_seconds)


def _end_session(session: WorkerSession, *, state: str, reason: str, now: datetime) -> None:
    """CAS a live session to an ended state (capacity 0, version + 1).

    The caller holds the worker lock and has just read the session live, so zero rows changed
    means the locking discipline was broken: raise rather than write half a transition.
    """
    changed = WorkerSession.objects.filter(pk=session.pk, state__in=LIVE_SESSION_STATES).update(
        state=state, end_reason=reason, ended_at=now, available_slots=0, version=F("version") + 1
    )
    if changed != 1:
        raise DomainError("session_version_conflict", "the session changed under the transition", field="sessionId")
    # Under the worker lock nothing else moved the row: mirror the update instead of re-reading.
    session.state, session.end_reason, session.ended_at, session.available_slots = state, reason, now, 0
    session.version += 1


def _expire(session: WorkerSession, *, now: datetime, actor_type: str) -> bool:
    """Mark a live session whose lease lapsed (by ``now``) ``expired``, settle its run leases and
    record ``session.expired``. The CAS re-checks state and expiry; False if it changed nothing."""
    from leases.settlement import settle_session_leases

    changed = WorkerSession.objects.filter(
        pk=session.pk, state__in=LIVE_SESSION_STATES, lease_expires_at__lte=now
    ).update(
        state=SessionState.EXPIRED, end_reason="lease_expired", ended_at=now, available_slots=0,
        version=F("version") + 1,
    )
    if not changed:
        return False
    session.refresh_from_db()
    settled = settle_session_leases(session, reason="session_expired", now=now, actor_type=actor_type)
    record(
        "session.expired",
        actor_type=actor_type,
        worker_id=session.worker_id,
        session_id=session.pk,
        data={"generation": session.generation, "settled_leases": settled},
    )
    return True


def fence_live_session(
    worker: Worker, *, reason: str, now: datetime, actor_type: str, actor: str = "",
    current: WorkerSession | None = None,
) -> WorkerSession | None:
    """Fence the worker's live session, if any, and settle its run leases (same transaction).

    For write paths that hold the worker lock (replacement, revocation, re-enrollment).
    ``reason``: ``superseded``, ``revoked`` or ``re_enrolled`` (keys of
    ``leases.settlement.SESSION_END_REASONS``);
    ``current``: the live session if the caller already read it under the lock. Writes: the
    session row (state ``fenced``, capacity 0, version + 1), a ``session.fenced`` event and
    whatever ``leases.settlement`` writes (started attempts lost, unstarted ones back in the
    queue). Returns the fenced session, or ``None`` if none was live.
    """
    from leases.settlement import settle_session_leases

    if current is None:
        current = WorkerSession.objects.filter(worker_id=worker.pk, state__in=LIVE_SESSION_STATES).first()
    if current is None:
        return None
    _end_session(current, state=SessionState.FENCED, reason=reason, now=now)
    settled = settle_session_leases(current, reason=reason, now=now, actor_type=actor_type, actor=actor)
    record(
        "session.fenced",
        actor_type=actor_type,
        actor=actor,
        worker_id=worker.pk,
        session_id=current.pk,
        data={"reason": reason, "generation": current.generation, "settled_leases": settled},
    )
    return current


def _takeover_refusal(worker: Worker, now: datetime) -> Refusal | None:
    """The takeover-storm limit: at most ``TAKEOVERS_PER_MINUTE`` replacements per worker per
    minute. Counted from ``session.replaced`` events (indexed by worker, kind, time)."""
    limit = protocol().takeovers_per_minute
    window = Event.objects.filter(
        worker_id=worker.pk, kind="session.replaced", created_at__gt=now - TAKEOVER_WINDOW
    ).aggregate(count=Count("id"), oldest=Min("created_at"))
    if window["count"] < limit:
        return None
    # Retry once the oldest counted replacement leaves the window.
    wait = (window["oldest"] + TAKEOVER_WINDOW - now).total_seconds()
    retry_after = min(60, max(1, math.ceil(wait)))
    record(
        "session.takeover_limited",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        data={"limit": limit, "retry_after_s": retry_after},
    )
    return Refusal(
        DomainError(
            "session_takeover_limited",
            f"this worker's session was replaced {window['count']} times in the last minute (limit {limit})",
            retry_after=retry_after,
            details={"limit": limit},
        )
    )


def _replay(worker: Worker, existing: WorkerSession, digest: str, now: datetime) -> SessionView | Refusal:
    """A registration naming a session id that exists: an exact replay, or a refusal."""
    if existing.worker_id == worker.pk and existing.registration_sha256 == digest:
        # Same process asking again (a lost response): answer as before, if it still may act.
        check_session(
            worker, existing, generation=existing.generation, expected_version=None, now=now,
            purpose=Purpose.REGISTER,
        )
        replaced = Event.objects.filter(kind="session.replaced", session_id=existing.pk).exists()
        return SessionView(session=existing, server_time=now, replayed=True, replaced_session=replaced)
    same_worker = existing.worker_id == worker.pk
    record(
        "session.replay_conflict",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        # Another worker's session id is not named in this worker's audit trail.
        session_id=existing.pk if same_worker else None,
        data={"reason": "content_differs" if same_worker else "other_worker"},
    )
    return Refusal(
        DomainError(
            "session_replay_conflict", "this session id was registered with different content", field="sessionId"
        )
    )


@write_path
def session_register(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    capabilities: CapabilitySnapshot,
    max_concurrent_runs: int,
    available_slots: int,
    software_version: str,
    protocol_version: int,
) -> SessionView | Refusal:
    """Register a process start as a new session, or replay/refuse one (ADR-0012 §2, §3, §6).

    Arguments: ``worker_id`` the authenticated worker; ``session_id`` a worker-generated UUIDv7;
    ``capabilities`` a validated snapshot (``protocol.capabilities.snapshot``);
    ``max_concurrent_runs`` 1–256; ``available_slots`` 0–max; ``software_version`` the agent's
    version string; ``protocol_version`` ≥ 1.

    Semantics: the first session of a worker gets generation 1, version 0. The same session id
    with identical content (capability digest, maximum concurrency, versions) is an exact replay:
    the session's current fence and timers, nothing written — if the session may still act
    (a fenced, offline or lapsed session is refused with its fence code). The same id with
    other content, or another worker's id, is ``session_replay_conflict`` and audited. A new id
    atomically replaces the live session: the old one is fenced and its run leases settled in
    this transaction, and the new one gets generation + 1 and a version above every earlier one.
    A live session whose lease already lapsed is marked ``expired`` instead (nothing to take
    over; not counted as a takeover). More than ``TAKEOVERS_PER_MINUTE`` replacements per worker
    in a minute: 429 ``session_takeover_limited`` (``Retry-After`` = seconds until the oldest
    counted replacement leaves the window), audited, the live session untouched. A worker under
    operator drain registers sessions that start ``draining`` with no capacity. The lease expiry
    is the database clock after the lock plus ``SESSION_LEASE_SECONDS``.

    Locks: the worker row (PostgreSQL ``FOR UPDATE``; SQLite: the IMMEDIATE transaction).
    Writes: session rows; ``session.fenced``/``session.expired``, ``session.registered``,
    ``session.replaced`` events; lease settlement. A unique-key race on insert re-runs the
    transaction (``qinglong.db.UniqueRace``).
    Raises: ``session_id_invalid``, ``validation_failed``, ``slots_exceed_maximum``,
    ``worker_not_found``, ``worker_revoked``, ``session_superseded``/``session_offline``/
    ``session_expired`` (a replay of an ended session), ``session_replay_conflict``,
    ``session_takeover_limited``, ``storage_busy``, ``lock_timeout``.
    """
    if not is_uuid7(session_id):
        raise DomainError("session_id_invalid", "the session id must be a UUIDv7", field="sessionId")
    _check_slots(available_slots, max_concurrent_runs)
    worker = lock_worker(worker_id)
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "the worker is revoked")
    now = db_now()
    digest = registration_sha256(
        capabilities_sha256=capabilities.sha256,
        max_concurrent_runs=max_concurrent_runs,
        software_version=software_version,
        protocol_version=protocol_version,
    )

    existing = WorkerSession.objects.filter(pk=session_id).first()
    if existing is not None:
        return _replay(worker, existing, digest, now)

    replaced = None
    current = WorkerSession.objects.filter(worker_id=worker.pk, state__in=LIVE_SESSION_STATES).first()
    if current is not None and current.lease_expires_at <= now:
        _expire(current, now=now, actor_type=ActorType.RECONCILER)
    elif current is not None:
        refusal = _takeover_refusal(worker, now)
        if refusal is not None:
            return refusal
        replaced = fence_live_session(worker, reason="superseded", now=now, actor_type=ActorType.WORKER,
                                      current=current)

    # The live session, when there was one, is the newest (and now ended, version bumped).
    latest = current or WorkerSession.objects.filter(worker_id=worker.pk).order_by("-generation").first()
    draining = worker.state == WorkerState.DRAINING
    try:
        session = WorkerSession.objects.create(
            id=session_id,
            worker=worker,
            generation=latest.generation + 1 if latest else 1,
            version=latest.version + 1 if latest else 0,
            state=SessionState.DRAINING if draining else SessionState.ONLINE,
            drained_by="operator" if draining else "",
            capabilities=capabilities.canonical_text,
            capabilities_sha256=capabilities.sha256,
            max_concurrent_runs=max_concurrent_runs,
            available_slots=0 if draining else available_slots,
            software_version=software_version,
            protocol_version=protocol_version,
            registration_sha256=digest,
            registered_at=now,
            lease_expires_at=now + _lease_ttl(),
        )
    except IntegrityError as exc:
        if is_unique_violation(exc):
            # Another transaction inserted this session id (another worker's registration)
            # after we looked: re-run, which reads its row and answers a conflict.
            raise UniqueRace("session id inserted concurrently") from exc
        raise
    record(
        "session.registered",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        session_id=session.pk,
        data={"generation": session.generation, "replaced": replaced is not None, "draining": draining},
    )
    if replaced is not None:
        record(
            "session.replaced",
            actor_type=ActorType.WORKER,
            worker_id=worker.pk,
            session_id=session.pk,
            data={"generation": session.generation, "previous_generation": replaced.generation},
        )
    return SessionView(session=session, server_time=now, replaced_session=replaced is not None)


# --- heartbeat -----------------------------------------------------------------------------------


def _effective_slots(session: WorkerSession, available_slots: int) -> int:
    """A draining session has no capacity whatever the worker reports."""
    return 0 if session.state == SessionState.DRAINING else available_slots


def _lease_needs_extension(session: WorkerSession, now: datetime) -> bool:
    """The write rule's first half: extend only once the lease has used more than half its TTL."""
    return session.lease_expires_at - now < _lease_ttl() / 2


def _heartbeat_needs_write(session: WorkerSession, available_slots: int, now: datetime) -> bool:
    return _lease_needs_extension(session, now) or _effective_slots(session, available_slots) != session.available_slots


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
    from leases.selectors import cancel_requested_attempt_ids

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
        check_session(worker, None, generation=generation, expected_version=expected_version, now=db_now(),
                      purpose=Purpose.HEARTBEAT)
        raise AssertionError("check_session accepts no missing session")
    now = session.db_now
    check_session(session.worker, session, generation=generation, expected_version=expected_version, now=now,
                  purpose=Purpose.HEARTBEAT)
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
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, expected_version: int, available_slots: int
) -> SessionView:
    """The heartbeat's write, under the worker lock: extend the lease and/or store new slots."""
    worker = lock_worker(worker_id)
    now = db_now()
    session = fence_session(
        worker,
        session_id=session_id,
        generation=generation,
        expected_version=expected_version,
        now=now,
        purpose=Purpose.HEARTBEAT,
    )
    slots = _effective_slots(session, available_slots)
    updates: dict[str, object] = {}
    if _lease_needs_extension(session, now):
        updates["lease_expires_at"] = now + _lease_ttl()
    if slots != session.available_slots:
        updates["available_slots"] = slots
        updates["version"] = F("version") + 1
    if updates:
        # The fence is in the WHERE clause too: a lapsed or ended session is never extended.
        changed = WorkerSession.objects.filter(
            pk=session.pk, generation=generation, version=expected_version, state__in=LIVE_SESSION_STATES,
            lease_expires_at__gt=now,
        ).update(**updates)
        if changed != 1:
            raise DomainError("session_version_conflict", "the session changed under the heartbeat",
                              field="expectedVersion")
        session.refresh_from_db()
    return SessionView(session=session, server_time=now)


# --- drain and offline ---------------------------------------------------------------------------


@write_path
def session_drain(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, expected_version: int
) -> SessionView:
    """The worker enters ``draining`` on shutdown (ADR-0012 §5.3–5.4).

    Arguments: the fence (``session_id``, ``generation``, ``expected_version``). In one
    transaction under the worker lock: state ``draining``, capacity 0, version + 1, a
    ``session.drained`` event. Heartbeats stay valid (with capacity held at 0), claims are
    refused with ``session_draining``, started attempts continue (ACK, renew, complete); the
    session stays draining until it goes offline or its lease lapses. Draining a draining
    session (with its current version) is an idempotent success that writes nothing. A worker's
    own drain lasts for this process only; an operator drain (``worker_drain``) also makes the
    worker's later sessions start draining.

    Raises: every ``fence_session`` code, ``storage_busy``, ``lock_timeout``.
    """
    worker = lock_worker(worker_id)
    now = db_now()
    session = fence_session(
        worker,
        session_id=session_id,
        generation=generation,
        expected_version=expected_version,
        now=now,
        purpose=Purpose.DRAIN,
    )
    if session.state == SessionState.DRAINING:
        return SessionView(session=session, server_time=now)
    changed = WorkerSession.objects.filter(pk=session.pk, version=expected_version, state=SessionState.ONLINE).update(
        state=SessionState.DRAINING, drained_by="worker", available_slots=0, version=F("version") + 1
    )
    if changed != 1:
        raise DomainError("session_version_conflict", "the session changed under the drain", field="expectedVersion")
    session.refresh_from_db()
    record(
        "session.drained",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        session_id=session.pk,
        data={"generation": session.generation, "by": "worker"},
    )
    return SessionView(session=session, server_time=now)


def _take_offline(
    worker: Worker, session: WorkerSession, *, now: datetime, force: bool, actor_type: str, actor: str
) -> SessionView:
    """End a live session ``offline`` (caller holds the worker lock and fenced the session)."""
    from leases.selectors import active_lease_count
    from leases.settlement import settle_session_leases

    active = active_lease_count(session.pk)
    if active and not force:
        raise DomainError(
            "session_has_active_leases",
            f"the session still holds {active} active run lease(s); finish or release them first",
            field="sessionId",
            details={"activeLeases": active},
        )
    reason = "worker_offline" if actor_type == ActorType.WORKER else ("forced_offline" if active else "operator_offline")
    _end_session(session, state=SessionState.OFFLINE, reason=reason, now=now)
    settled = settle_session_leases(session, reason="session_offline", now=now, actor_type=actor_type,
                                    actor=actor) if active else 0
    record(
        "session.offline",
        actor_type=actor_type,
        actor=actor,
        worker_id=worker.pk,
        session_id=session.pk,
        data={"generation": session.generation, "forced": force, "settled_leases": settled},
    )
    return SessionView(session=session, server_time=now)


@write_path
def session_offline(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, expected_version: int, actor: str = ""
) -> SessionView:
    """The worker ends its session cleanly (ADR-0012 §5.5). Refused while it holds run leases.

    Arguments: the fence (``session_id``, ``generation``, ``expected_version``); ``actor`` the
    worker's name for the audit row. Allowed from ``online`` and ``draining``. Under the worker
    lock (so no claim can slip in): if the session holds no active run lease, in one
    transaction: state ``offline``, capacity 0, version + 1, ``ended_at``, a ``session.offline``
    event; the session can never act again. A worker cannot force: only an operator can take a
    session with active leases offline (:func:`session_operator_offline`).

    Raises: every ``fence_session`` code, ``session_has_active_leases`` (409,
    ``details.activeLeases``), ``storage_busy``, ``lock_timeout``.
    """
    worker = lock_worker(worker_id)
    now = db_now()
    session = fence_session(
        worker,
        session_id=session_id,
        generation=generation,
        expected_version=expected_version,
        now=now,
        purpose=Purpose.OFFLINE,
    )
    return _take_offline(worker, session, now=now, force=False, actor_type=ActorType.WORKER, actor=actor)


@write_path
def session_operator_offline(*, worker_id: uuid.UUID, force: bool = False, actor: str = "") -> SessionView:
    """Operator: take the worker's live session offline now (admin action, ``manage.py
    session_offline``; ADR-0012 §5, PRODUCT invariant 12).

    Arguments: ``worker_id``; ``force`` whether to proceed although the session holds active
    run leases; ``actor`` the operator's username. Without ``force`` it is refused like the
    worker's own offline. With ``force`` the session's active leases are settled in the same
    transaction (``leases.settlement``, reason ``session_offline``): started attempts become
    ``lost`` and are retried or failed per their policy, unstarted ones return to the queue.
    The worker's next call is refused with ``session_offline``; a new process may register.

    Locks: the worker row. Raises: ``worker_not_found``, ``no_live_session``,
    ``session_has_active_leases``, ``storage_busy``, ``lock_timeout``.
    """
    worker = lock_worker(worker_id)
    now = db_now()
    session = WorkerSession.objects.filter(worker_id=worker.pk, state__in=LIVE_SESSION_STATES).first()
    if session is None:
        raise DomainError("no_live_session", "the worker has no online or draining session")
    return _take_offline(worker, session, now=now, force=force, actor_type=ActorType.OPERATOR, actor=actor)


# --- expiry --------------------------------------------------------------------------------------


@write_path
def session_expire(*, session_id: uuid.UUID) -> bool:
    """Mark one lapsed session ``expired`` and settle its run leases; False if it was not lapsed.

    Locks the session's worker first (``lock_worker_for_session``), then re-checks state and
    expiry against the database clock in the ``UPDATE … WHERE`` itself, so it is safe against
    heartbeats, replacements and other sweepers running at once. A lapsed session was already
    invisible to candidates (``placement.selectors.live_workers``) and refused by every fence
    before this runs; this records the fact (``session.expired``) and settles its leases
    (ADR-0012 §3). Raises: ``storage_busy``, ``lock_timeout``.
    """
    worker = lock_worker_for_session(session_id)
    if worker is None:
        return False
    now = db_now()
    session = WorkerSession.objects.get(pk=session_id)
    return _expire(session, now=now, actor_type=ActorType.RECONCILER)


def sweep_expired_sessions(*, batch: int | None = None) -> int:
    """Mark up to ``batch`` (default ``SWEEP_BATCH``) lapsed live sessions expired (ADR-0012 §3).

    Oldest expiry first, one :func:`session_expire` transaction each; returns how many it marked.
    Safe on many replicas and sweepers at once (each write re-checks). Raises ``storage_busy``,
    ``lock_timeout`` from a single expiry (the caller's loop carries on next cycle).
    """
    limit = batch or protocol().sweep_batch
    now = db_now()
    lapsed = list(
        WorkerSession.objects.filter(state__in=LIVE_SESSION_STATES, lease_expires_at__lte=now)
        .order_by("lease_expires_at")
        .values_list("pk", flat=True)[:limit]
    )
    return sum(1 for session_id in lapsed if session_expire(session_id=session_id))
