"""Session write paths: register, heartbeat, drain, offline, expiry sweep (ADR-0012 §2, §3, §5).

Each public function is one transaction (``qinglong.db.write_path``) that locks the worker row
first (``workers.locks``) and reads the database clock after the lock. Refusals write nothing,
except the two the audit trail must show: a conflicting replay and a rate-limited takeover.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import rfc8785
from django.db.models import F

from audit.models import ActorType
from audit.recorder import record
from protocol.capabilities import CapabilitySnapshot
from protocol.ids import is_uuid7
from qinglong.conf import protocol
from qinglong.db import Refusal, db_now, write_path
from qinglong.errors import DomainError

from ..fence import Purpose, fence_session
from ..locks import lock_worker
from ..models import LIVE_SESSION_STATES, SessionState, Worker, WorkerSession, WorkerState

MAX_CONCURRENT_RUNS = 256


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
    """Digest of what a registration fixes for the session's life (available slots are dynamic)."""
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
    if available_slots > max_concurrent_runs:
        raise DomainError(
            "slots_exceed_maximum",
            f"availableSlots {available_slots} is above maxConcurrentRuns {max_concurrent_runs}",
            field="availableSlots",
        )


def _end_session(session: WorkerSession, *, state: str, reason: str, now: datetime) -> bool:
    """CAS a live session to an ended state, bumping its version; False if it was no longer live."""
    changed = WorkerSession.objects.filter(pk=session.pk, state__in=LIVE_SESSION_STATES).update(
        state=state, end_reason=reason, ended_at=now, available_slots=0, version=F("version") + 1
    )
    return changed == 1


def fence_live_session(
    worker: Worker, *, reason: str, now: datetime, actor_type: str, actor: str = ""
) -> WorkerSession | None:
    """Fence the worker's live session, if any, and settle its run leases (same transaction).

    For use inside a write path that holds the worker lock (replacement, revocation). Writes the
    session row, a ``session.fenced`` event and whatever ``leases.settlement`` writes.
    """
    from leases.settlement import settle_session_leases

    current = WorkerSession.objects.filter(worker_id=worker.pk, state__in=LIVE_SESSION_STATES).first()
    if current is None:
        return None
    _end_session(current, state=SessionState.FENCED, reason=reason, now=now)
    settle_session_leases(current, reason=reason, now=now, actor_type=actor_type, actor=actor)
    record(
        "session.fenced",
        actor_type=actor_type,
        actor=actor,
        worker_id=worker.pk,
        session_id=current.pk,
        data={"reason": reason, "generation": current.generation},
    )
    return current


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
    """Register a process start as a new session, or replay/refuse one (ADR-0012 §2).

    Arguments: ``session_id`` a worker-generated UUIDv7; ``capabilities`` a validated snapshot
    (``protocol.capabilities.snapshot``); ``max_concurrent_runs`` 1–256; ``available_slots``
    0–max; ``software_version`` the agent's version string; ``protocol_version`` ≥ 1.

    Semantics: the first session of a worker gets generation 1, version 0. The same session id
    with identical content (capability digest, maximum concurrency, versions) is an exact replay:
    same answer, nothing written. The same id with other content is refused and audited. A new
    session id atomically replaces the live session: generation and version go up, the old one is
    fenced and its run leases settled in this transaction. More than ``TAKEOVERS_PER_MINUTE``
    replacements in a minute are refused (429) and audited. A worker under operator drain
    registers sessions that start ``draining`` with no capacity.

    Locks: the worker row. Writes: session rows, events, lease settlement.
    Raises: ``session_id_invalid``, ``validation_failed``, ``slots_exceed_maximum``,
    ``worker_not_found``, ``worker_revoked``, ``session_superseded``/``session_offline``/
    ``session_expired`` (the id names an ended session), ``session_replay_conflict``,
    ``session_takeover_limited``.
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
        if existing.worker_id == worker.pk and existing.registration_sha256 == digest:
            # Same process asking again (a lost response): answer as before, if it still may act.
            fence_session(
                worker,
                session_id=session_id,
                generation=existing.generation,
                expected_version=None,
                now=now,
                purpose=Purpose.HEARTBEAT,
            )
            return SessionView(session=existing, server_time=now, replayed=True)
        record(
            "session.replay_conflict",
            actor_type=ActorType.WORKER,
            worker_id=worker.pk,
            session_id=session_id if existing.worker_id == worker.pk else None,
        )
        return Refusal(
            DomainError(
                "session_replay_conflict",
                "this session id was registered with different content",
                field="sessionId",
            )
        )

    current = WorkerSession.objects.filter(worker_id=worker.pk, state__in=LIVE_SESSION_STATES).first()
    if current is not None:
        limit = protocol().takeovers_per_minute
        from audit.models import Event

        recent = Event.objects.filter(
            worker_id=worker.pk, kind="session.replaced", created_at__gt=now - timedelta(minutes=1)
        ).count()
        if recent >= limit:
            record("session.takeover_limited", actor_type=ActorType.WORKER, worker_id=worker.pk, data={"limit": limit})
            return Refusal(
                DomainError(
                    "session_takeover_limited",
                    f"more than {limit} session replacements in a minute",
                    retry_after=60,
                )
            )

    latest = WorkerSession.objects.filter(worker_id=worker.pk).order_by("-generation").first()
    if current is not None:
        fence_live_session(worker, reason="superseded", now=now, actor_type=ActorType.WORKER)
        latest.refresh_from_db(fields=["version"])  # the fence bumped it

    draining = worker.state == WorkerState.DRAINING
    session = WorkerSession.objects.create(
        id=session_id,
        worker=worker,
        generation=(latest.generation + 1) if latest else 1,
        version=(latest.version + 1) if latest else 0,
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
        lease_expires_at=now + timedelta(seconds=protocol().session_lease_seconds),
    )
    record(
        "session.registered",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        session_id=session.pk,
        data={"generation": session.generation, "replaced": current is not None, "draining": draining},
    )
    if current is not None:
        record(
            "session.replaced",
            actor_type=ActorType.WORKER,
            worker_id=worker.pk,
            session_id=session.pk,
            data={"generation": session.generation, "previous_generation": current.generation},
        )
    return SessionView(session=session, server_time=now, replaced_session=current is not None)


def session_heartbeat(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int,
    available_slots: int,
) -> SessionView:
    """Keep a session alive and report its free capacity (ADR-0012 §3, §5).

    Write rule (documented in docs/protocol.md): a heartbeat writes the session row only when
    (a) the lease has used up more than half its TTL — then the lease is extended to now + TTL —
    or (b) ``available_slots`` changed — then the version goes up by one. Any other heartbeat is
    a pure read: the fence is checked, nothing is written. A draining session's capacity stays 0.

    ``available_slots`` must not exceed the session's ``max_concurrent_runs``.
    Raises: every ``fence_session`` code, ``slots_exceed_maximum``.
    """
    from leases.selectors import cancel_requested_attempt_ids

    session = WorkerSession.objects.select_related("worker").filter(pk=session_id, worker_id=worker_id).first()
    if session is None:
        raise DomainError("session_unknown", "no such session for this worker", field="sessionId")
    now = db_now()
    fence_session(
        session.worker,
        session_id=session_id,
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
    if _heartbeat_needs_write(session, available_slots, now):
        view = _heartbeat_write(
            worker_id=worker_id,
            session_id=session_id,
            generation=generation,
            expected_version=expected_version,
            available_slots=available_slots,
        )
    else:
        view = SessionView(session=session, server_time=now)
    return SessionView(
        session=view.session,
        server_time=view.server_time,
        cancel_requested=tuple(cancel_requested_attempt_ids(session_id)),
        rotation_required=session.worker.rotation_required,
    )


def _effective_slots(session: WorkerSession, available_slots: int) -> int:
    return 0 if session.state == SessionState.DRAINING else available_slots


def _heartbeat_needs_write(session: WorkerSession, available_slots: int, now: datetime) -> bool:
    half_life = timedelta(seconds=protocol().session_lease_seconds / 2)
    return session.lease_expires_at - now < half_life or (
        _effective_slots(session, available_slots) != session.available_slots
    )


@write_path
def _heartbeat_write(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, expected_version: int, available_slots: int
) -> SessionView:
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
    half_life = timedelta(seconds=protocol().session_lease_seconds / 2)
    if session.lease_expires_at - now < half_life:
        updates["lease_expires_at"] = now + timedelta(seconds=protocol().session_lease_seconds)
    if slots != session.available_slots:
        updates["available_slots"] = slots
        updates["version"] = F("version") + 1
    if updates:
        WorkerSession.objects.filter(
            pk=session.pk, generation=generation, version=expected_version, state__in=LIVE_SESSION_STATES
        ).update(**updates)
        session.refresh_from_db()
    return SessionView(session=session, server_time=now)


@write_path
def session_drain(
    *, worker_id: uuid.UUID, session_id: uuid.UUID, generation: int, expected_version: int, actor: str = "worker"
) -> SessionView:
    """Enter ``draining``: capacity 0 in the same transaction, heartbeats stay valid (ADR-0012 §5.3).

    Draining an already draining session is an idempotent success (no write). The session stays
    draining until the worker goes offline; claims are refused meanwhile.
    Raises: every ``fence_session`` code.
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
    WorkerSession.objects.filter(pk=session.pk, version=expected_version, state=SessionState.ONLINE).update(
        state=SessionState.DRAINING, drained_by=actor, available_slots=0, version=F("version") + 1
    )
    session.refresh_from_db()
    record(
        "session.drained",
        actor_type=ActorType.WORKER,
        worker_id=worker.pk,
        session_id=session.pk,
        data={"generation": session.generation},
    )
    return SessionView(session=session, server_time=now)


@write_path
def session_offline(
    *,
    worker_id: uuid.UUID,
    session_id: uuid.UUID,
    generation: int,
    expected_version: int,
    force: bool = False,
    actor_type: str = ActorType.WORKER,
    actor: str = "",
) -> SessionView:
    """End a session cleanly (ADR-0012 §5.5). Refused while it holds active run leases.

    ``force`` (operators only) ends it anyway; its leases are then settled as lost/released in
    the same transaction (``leases.settlement``). Capacity is zero once this commits.
    Raises: every ``fence_session`` code, ``session_has_active_leases``.
    """
    from leases.selectors import active_lease_count
    from leases.settlement import settle_session_leases

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
    active = active_lease_count(session.pk)
    if active and not force:
        raise DomainError(
            "session_has_active_leases",
            f"the session still holds {active} active run lease(s)",
            field="sessionId",
            details={"activeLeases": active},
        )
    _end_session(session, state=SessionState.OFFLINE, reason="forced" if force else "worker_offline", now=now)
    if active:
        settle_session_leases(session, reason="session_offline", now=now, actor_type=actor_type, actor=actor)
    session.refresh_from_db()
    record(
        "session.offline",
        actor_type=actor_type,
        actor=actor,
        worker_id=worker.pk,
        session_id=session.pk,
        data={"generation": session.generation, "forced": force, "settled_leases": active},
    )
    return SessionView(session=session, server_time=now)


@write_path
def session_expire(*, session_id: uuid.UUID) -> bool:
    """Mark one lapsed session ``expired`` and settle its leases; False if it was not lapsed.

    The sweep's write re-checks state and expiry in its own ``UPDATE … WHERE``, so it is safe to
    run concurrently with heartbeats and with other sweepers. An expired session was already
    invisible to candidates and refused by every fence before this runs; this records the fact.
    """
    from leases.settlement import settle_session_leases

    session = WorkerSession.objects.filter(pk=session_id).only("worker_id").first()
    if session is None:
        return False
    lock_worker(session.worker_id)
    now = db_now()
    changed = WorkerSession.objects.filter(
        pk=session_id, state__in=LIVE_SESSION_STATES, lease_expires_at__lte=now
    ).update(state=SessionState.EXPIRED, end_reason="lease_expired", ended_at=now, available_slots=0)
    if not changed:
        return False
    session.refresh_from_db()
    settle_session_leases(session, reason="session_expired", now=now, actor_type=ActorType.RECONCILER)
    record(
        "session.expired",
        actor_type=ActorType.RECONCILER,
        worker_id=session.worker_id,
        session_id=session.pk,
        data={"generation": session.generation},
    )
    return True


def sweep_expired_sessions(*, batch: int | None = None) -> int:
    """Mark up to ``batch`` lapsed live sessions expired, one transaction each; return how many."""
    limit = batch or protocol().sweep_batch
    now = db_now()
    lapsed = list(
        WorkerSession.objects.filter(state__in=LIVE_SESSION_STATES, lease_expires_at__lte=now)
        .order_by("lease_expires_at")
        .values_list("pk", flat=True)[:limit]
    )
    return sum(1 for session_id in lapsed if session_expire(session_id=session_id))
