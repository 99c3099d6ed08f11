"""Row locks on schedules — the only place schedules are locked (tasks: ``runs/locks.py``).

Order: task -> schedule, and both before anything in the global order of ``workers/locks.py``
(worker -> session -> run -> attempt -> lease); an admission creates runs but locks none. Locking
the task serialises every admission of one task, so two schedules of a task with overlap ``skip``
cannot both see "no live run" and both start one. On SQLite ``select_for_update`` is a no-op:
IMMEDIATE transactions serialise all writers instead.
"""

from __future__ import annotations

import uuid

from core.errors import DomainError
from runs.locks import lock_task, try_lock_task

from .models import Schedule


def lock_schedule(schedule_id: uuid.UUID) -> Schedule:
    """Lock the schedule's task, then the schedule (``SELECT … FOR UPDATE``).

    Raises ``schedule_not_found``.
    """
    task_id = Schedule.objects.filter(pk=schedule_id).values_list("task_id", flat=True).first()
    if task_id is None:
        raise DomainError("schedule_not_found", "no such schedule")
    lock_task(task_id)
    schedule = Schedule.objects.select_for_update(of=("self",)).filter(pk=schedule_id).first()
    if schedule is None:
        raise DomainError("schedule_not_found", "no such schedule")
    return schedule


def try_lock_schedule(schedule_id: uuid.UUID) -> Schedule | None:
    """For the sweep: lock the task and schedule unless another replica holds them (``SKIP LOCKED``).

    None if skipped or gone; that replica's decision covers the schedule this cycle.
    """
    task_id = Schedule.objects.filter(pk=schedule_id).values_list("task_id", flat=True).first()
    if task_id is None:
        return None
    if try_lock_task(task_id) is None:
        return None
    return Schedule.objects.select_for_update(of=("self",), skip_locked=True).filter(pk=schedule_id).first()
