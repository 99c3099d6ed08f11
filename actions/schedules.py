"""Schedule write paths: create, change, delete, and the admission of due fires (``docs/schedules.md``).

Admission is exactly once across replicas: a decision locks the schedule's task and the schedule
(``SKIP LOCKED``: a replica never waits for another's decision), re-reads due-ness on the database
clock, moves ``next_fire_at`` by compare-and-swap on ``version`` and writes one ``ScheduleFire``
row, unique per (schedule, fire time). A run it starts goes through ``actions.runs`` (the same
enqueue as the API) and is named by that row.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.db.models import F

from actions.runs import enqueue_revision
from audit.models import ActorType
from audit.recorder import record
from core.conf import protocol
from core.db import db_now, write_path
from core.errors import DomainError
from protocol.ids import uuid7
from runs import selectors as run_selectors
from runs.models import Run, Task
from schedules import rules
from schedules.locks import lock_schedule, try_lock_schedule
from schedules.models import FireOutcome, MisfirePolicy, OverlapPolicy, Schedule, ScheduleFire
from schedules.rules import ScheduleSpec
from schedules.selectors import due_schedule_ids, live_runs

log = logging.getLogger(__name__)


def _actor(user) -> str:
    return getattr(user, "username", "") or ""


def _validated(spec: ScheduleSpec) -> ScheduleSpec:
    return rules.validate_spec(
        spec, overlaps=tuple(OverlapPolicy.values), misfires=tuple(MisfirePolicy.values)
    )


def _first_fire(
    spec: ScheduleSpec, schedule_id: uuid.UUID, now: datetime
) -> tuple[datetime | None, datetime | None]:
    """(next fire, its due time) after ``now`` for an enabled spec; (None, None) otherwise."""
    if not spec.enabled:
        return None, None
    fire = rules.next_fire(spec.cron, ZoneInfo(spec.timezone), now, start=spec.start_at, end=spec.end_at)
    if fire is None:
        return None, None
    return fire, fire + rules.jitter_offset(schedule_id, spec.jitter_seconds)


def _spec_fields(spec: ScheduleSpec) -> dict[str, object]:
    return asdict(spec)


@write_path
def schedule_create(
    *, task_id: uuid.UUID, spec: ScheduleSpec, user=None, actor_type: str = ActorType.OPERATOR, role: str = ""
) -> Schedule:
    """Create a schedule on a task; its first fire is the first after now (database clock).

    ``spec``: :class:`schedules.rules.ScheduleSpec`. Writes the schedule and ``schedule.created``.
    Raises ``validation_failed`` naming the field, ``task_not_found`` (field ``task``).
    """
    spec = _validated(spec)
    if not Task.objects.filter(pk=task_id).exists():
        raise DomainError("task_not_found", "no such task", field="task")
    now = db_now()
    schedule_id = uuid7()
    schedule = Schedule(id=schedule_id, task_id=task_id, created_at=now, updated_at=now, **_spec_fields(spec))
    schedule.next_fire_at, schedule.due_at = _first_fire(spec, schedule.pk, now)
    if user is not None and getattr(user, "pk", None):
        schedule.created_by = user
    schedule.save(force_insert=True)
    record(
        "schedule.created",
        actor_type=actor_type,
        actor=_actor(user),
        data={"schedule": str(schedule.pk), "task": str(task_id), "role": role},
    )
    return schedule


@write_path
def schedule_update(
    *,
    schedule_id: uuid.UUID,
    spec: ScheduleSpec,
    expected_version: int | None = None,
    user=None,
    actor_type: str = ActorType.OPERATOR,
    role: str = "",
) -> Schedule:
    """Replace a schedule's settings (compare-and-swap on ``version``).

    A change of expression, zone, window, jitter or enabled recomputes the next fire from now:
    fires between the old and the new settings are not caught up. ``expected_version``: the
    version the caller read (None: whatever it is now). Locks: task, then schedule. Writes
    ``schedule.changed`` with the changed field names. Raises ``schedule_not_found``,
    ``schedule_version_conflict`` (409, details ``version``), ``validation_failed``.
    """
    spec = _validated(spec)
    schedule = lock_schedule(schedule_id)
    if expected_version is not None and expected_version != schedule.version:
        raise DomainError(
            "schedule_version_conflict",
            "the schedule changed since it was read",
            field="expectedVersion",
            details={"version": schedule.version},
        )
    fields = _spec_fields(spec)
    changed = {name: 1 for name, value in fields.items() if getattr(schedule, name) != value}
    now = db_now()
    updates: dict[str, object] = {**fields, "updated_at": now, "version": F("version") + 1}
    if any(name in changed for name in rules.TIMING_FIELDS):
        updates["next_fire_at"], updates["due_at"] = _first_fire(spec, schedule.pk, now)
        if not spec.enabled and schedule.pending_fire_at is not None:
            updates["pending_fire_at"] = None  # a disabled schedule starts nothing, deferred or not
            ScheduleFire.objects.filter(schedule=schedule, outcome=FireOutcome.DEFERRED).update(
                outcome=FireOutcome.SKIPPED_OVERLAP
            )
    if not Schedule.objects.filter(pk=schedule.pk, version=schedule.version).update(**updates):
        raise DomainError("schedule_version_conflict", "the schedule changed under the request")
    record(
        "schedule.changed",
        actor_type=actor_type,
        actor=_actor(user),
        data={"schedule": str(schedule.pk), "changed": changed, "role": role},
    )
    schedule.refresh_from_db()
    return schedule


@write_path
def schedule_delete(
    *, schedule_id: uuid.UUID, user=None, actor_type: str = ActorType.OPERATOR, role: str = ""
) -> None:
    """Delete a schedule and its fire history (runs it started stay). Writes ``schedule.deleted``.

    Raises ``schedule_not_found``.
    """
    schedule = lock_schedule(schedule_id)
    task_id = schedule.task_id
    schedule.delete()
    record(
        "schedule.deleted",
        actor_type=actor_type,
        actor=_actor(user),
        data={"schedule": str(schedule_id), "task": str(task_id), "role": role},
    )


@dataclass(frozen=True)
class Admission:
    """One admission decision: which fire, what became of it, and the run it started (if any)."""

    schedule_id: uuid.UUID
    fire_at: datetime
    outcome: str
    fires: int
    run_id: uuid.UUID | None


def _start_run(schedule: Schedule, fire_at: datetime) -> Run:
    revision = run_selectors.latest_revision(schedule.task)
    return enqueue_revision(
        revision=revision,
        priority=schedule.priority,
        actor_type=ActorType.SCHEDULER,
        actor=f"schedule:{schedule.pk}",
        created_data={"schedule": str(schedule.pk), "fireAt": fire_at.isoformat()},
    )


def _record_fire(schedule: Schedule, fire: ScheduleFire) -> None:
    record(
        "schedule.fired",
        actor_type=ActorType.SCHEDULER,
        actor=f"schedule:{schedule.pk}",
        run_id=fire.run_id,
        data={
            "schedule": str(schedule.pk),
            "fireAt": fire.fire_at.isoformat(),
            "outcome": fire.outcome,
            "fires": fire.fires,
        },
    )


def _admit_deferred(schedule: Schedule, pending_fire_at: datetime, now: datetime) -> Admission | None:
    """queue_one: start the deferred fire once no run of the task is live."""
    if live_runs(schedule.task_id).exists():
        return None
    fire = ScheduleFire.objects.filter(
        schedule=schedule, fire_at=pending_fire_at, outcome=FireOutcome.DEFERRED
    ).first()
    if not Schedule.objects.filter(pk=schedule.pk, version=schedule.version).update(
        pending_fire_at=None, version=F("version") + 1
    ):
        return None  # another decision got there first
    schedule.version, schedule.pending_fire_at = schedule.version + 1, None
    if fire is None:  # its row went with an edit of the schedule: nothing left to start
        return None
    run = _start_run(schedule, fire.fire_at)
    ScheduleFire.objects.filter(pk=fire.pk, outcome=FireOutcome.DEFERRED).update(
        outcome=FireOutcome.QUEUED, run=run, decided_at=now
    )
    Schedule.objects.filter(pk=schedule.pk).update(last_run=run, last_outcome=FireOutcome.QUEUED)
    fire.outcome, fire.run_id = FireOutcome.QUEUED, run.pk
    _record_fire(schedule, fire)
    return Admission(schedule.pk, fire.fire_at, FireOutcome.QUEUED, fire.fires, run.pk)


def _decide(schedule: Schedule, now: datetime) -> tuple[datetime, int, bool]:
    """(fire time, how many fires it stands for, whether it is a misfire) for a due schedule.

    On time (the first due fire is at most the grace late): that fire alone. Otherwise a gap:
    the newest due fire stands for every due fire, and it is a misfire if it too is late.
    """
    assert schedule.next_fire_at is not None
    zone = ZoneInfo(schedule.timezone)
    jitter = rules.jitter_offset(schedule.pk, schedule.jitter_seconds)
    grace = timedelta(seconds=schedule.misfire_grace_seconds)
    first = schedule.next_fire_at
    if now - (first + jitter) <= grace:
        return first, 1, False
    horizon = now - jitter
    if schedule.end_at is not None:
        horizon = min(horizon, schedule.end_at)
    latest = rules.latest_fire_at_or_before(schedule.cron, zone, horizon, not_before=first) or first
    fires = rules.count_fires(schedule.cron, zone, first, latest)
    return latest, max(fires, 1), now - (latest + jitter) > grace


@write_path
def schedule_admit(*, schedule_id: uuid.UUID) -> Admission | None:
    """Decide the schedule's next due fire, if any (one transaction; ``docs/schedules.md``).

    Locks: task, then schedule, both ``SKIP LOCKED`` (None when another replica holds them).
    Re-checks due-ness on the database clock, then applies the misfire policy (a fire more than
    ``misfire_grace_seconds`` late) and the overlap policy (a run of the task still live), moves
    ``next_fire_at`` by compare-and-swap, writes the ``ScheduleFire`` row and ``schedule.fired``,
    and starts at most one run (``actions.runs.enqueue_revision``). A deferred ``queue_one`` fire
    is started first once nothing of the task is live. Returns the decision, or None (not due,
    nothing changed).
    """
    schedule = try_lock_schedule(schedule_id)
    if schedule is None:
        return None
    now = db_now()
    if schedule.pending_fire_at is not None:
        started = _admit_deferred(schedule, schedule.pending_fire_at, now)
        if started is not None:
            return started
    if schedule.next_fire_at is None or schedule.due_at is None or schedule.due_at > now:
        return None
    fire_at, fires, misfire = _decide(schedule, now)
    zone = ZoneInfo(schedule.timezone)
    following = rules.next_fire(schedule.cron, zone, fire_at, start=schedule.start_at, end=schedule.end_at)
    jitter = rules.jitter_offset(schedule.pk, schedule.jitter_seconds)
    cas = Schedule.objects.filter(
        pk=schedule.pk, version=schedule.version, next_fire_at=schedule.next_fire_at
    )
    due_next = following + jitter if following is not None else None
    if ScheduleFire.objects.filter(schedule=schedule, fire_at=fire_at).exists():
        # Decided before (an edit moved the next fire back onto it): move on, never a second run.
        cas.update(next_fire_at=following, due_at=due_next, version=F("version") + 1)
        log.warning("schedule %s fire %s was already decided; skipped", schedule.pk, fire_at.isoformat())
        return None
    if misfire and schedule.misfire == MisfirePolicy.SKIP:
        outcome = FireOutcome.SKIPPED_MISFIRE
    elif schedule.overlap == OverlapPolicy.ALLOW or not live_runs(schedule.task_id).exists():
        outcome = FireOutcome.QUEUED
    elif schedule.overlap == OverlapPolicy.QUEUE_ONE and schedule.pending_fire_at is None:
        outcome = FireOutcome.DEFERRED
    else:
        outcome = FireOutcome.SKIPPED_OVERLAP
    updates: dict[str, object] = {
        "next_fire_at": following,
        "due_at": due_next,
        "last_fire_at": fire_at,
        "last_outcome": outcome,
        "version": F("version") + 1,
    }
    if outcome == FireOutcome.DEFERRED:
        updates["pending_fire_at"] = fire_at
    if not cas.update(**updates):
        return None  # another decision moved the schedule first: this fire is theirs
    run = _start_run(schedule, fire_at) if outcome == FireOutcome.QUEUED else None
    fire = ScheduleFire.objects.create(
        schedule=schedule,
        fire_at=fire_at,
        due_at=fire_at + jitter,
        decided_at=now,
        outcome=outcome,
        fires=fires,
        run=run,
    )
    if run is not None:
        Schedule.objects.filter(pk=schedule.pk).update(last_run=run)
    _record_fire(schedule, fire)
    return Admission(schedule.pk, fire_at, outcome, fires, run.pk if run is not None else None)


def sweep_due_schedules(*, batch: int | None = None) -> int:
    """Admit due fires, at most ``batch`` (default ``SWEEP_BATCH``) decisions in this call.

    One transaction per decision (:func:`schedule_admit`); passes repeat while they decide
    something, so a schedule with several fires due (a seconds field, a short outage) catches
    up within the bound. Safe with any number of sweepers on any number of replicas. Returns
    how many decisions were made (runs started, deferred or skipped fires).
    """
    budget = batch or protocol().sweep_batch
    decided = 0
    while decided < budget:
        progressed = 0
        for schedule_id in due_schedule_ids(now=db_now(), limit=budget - decided):
            try:
                progressed += schedule_admit(schedule_id=schedule_id) is not None
            except DomainError as exc:
                if exc.code not in ("lock_timeout", "storage_busy"):
                    raise
                log.warning("schedule %s not admitted this cycle: %s", schedule_id, exc.code)
        decided += progressed
        if not progressed:
            break
    return decided
