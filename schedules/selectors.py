"""Reads for schedules: the admission queue, live runs of a task, a schedule's next fires."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import QuerySet

from core.errors import DomainError
from runs.models import Run
from runs.states import RUN_TERMINAL

from . import rules
from .models import Schedule


def schedule_get(schedule_id: uuid.UUID) -> Schedule:
    """The schedule with its task and last run; raises ``schedule_not_found``."""
    schedule = Schedule.objects.select_related("task", "last_run").filter(pk=schedule_id).first()
    if schedule is None:
        raise DomainError("schedule_not_found", "no such schedule")
    return schedule


def due_schedule_ids(*, now: datetime, limit: int) -> list[uuid.UUID]:
    """Up to ``limit`` schedules with a fire due at ``now`` or a deferred fire, soonest due first
    (partial indexes ``schedule_due``, ``schedule_pending``)."""
    due = list(
        Schedule.objects.filter(due_at__lte=now).order_by("due_at", "id").values_list("pk", flat=True)[:limit]
    )
    pending = list(
        Schedule.objects.filter(pending_fire_at__isnull=False)
        .exclude(pk__in=due)
        .order_by("pending_fire_at", "id")
        .values_list("pk", flat=True)[: max(0, limit - len(due))]
    )
    return due + pending


def live_runs(task_id: uuid.UUID) -> QuerySet[Run]:
    """Runs of the task that have not ended (any state but succeeded/failed/cancelled/timed_out)."""
    return Run.objects.filter(task_id=task_id).exclude(state__in=RUN_TERMINAL)


def upcoming(schedule: Schedule, count: int, *, after: datetime) -> list[datetime]:
    """The schedule's next ``count`` fire times after ``after`` within its window, in its zone."""
    if not schedule.enabled:
        return []
    zone = rules.validate_zone(schedule.timezone)
    times = []
    for fire in rules.fires_in_window(
        schedule.cron, zone, after, start=schedule.start_at, end=schedule.end_at
    ):
        times.append(fire)
        if len(times) >= count:
            break
    return times


def schedules_of(queryset: QuerySet[Schedule] | None = None) -> QuerySet[Schedule]:
    """Schedules with what their lists show (task, last run)."""
    return (queryset if queryset is not None else Schedule.objects.all()).select_related("task", "last_run")
