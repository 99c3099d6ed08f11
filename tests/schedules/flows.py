"""Schedule test helpers: create schedules through the real write path, and move time by
moving a schedule's fire times in the database (never by sleeping)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from actions.schedules import schedule_create
from core.db import db_now
from schedules import rules
from schedules.models import Schedule
from schedules.rules import ScheduleSpec


def make_schedule(revision, cron: str = "* * * * *", **settings) -> Schedule:
    return schedule_create(task_id=revision.task_id, spec=ScheduleSpec(cron=cron, **settings))


def rewind(schedule: Schedule, next_fire_at: datetime) -> Schedule:
    """Pretend the control plane last decided just before ``next_fire_at`` (a fire of the expression)."""
    jitter = rules.jitter_offset(schedule.pk, schedule.jitter_seconds)
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=next_fire_at, due_at=next_fire_at + jitter)
    schedule.refresh_from_db()
    return schedule


def fires_between(schedule: Schedule, first: datetime, last: datetime) -> list[datetime]:
    """The schedule's fire times in ``[first, last]`` (UTC)."""
    zone = ZoneInfo(schedule.timezone)
    times = []
    for fire in rules.fires_after(schedule.cron, zone, first - timedelta(microseconds=1)):
        if fire > last:
            break
        times.append(fire.astimezone(UTC))
    return times


def hourly_fired_ago(seconds: int) -> tuple[str, datetime]:
    """A six-field expression that fires every hour and last fired ``seconds`` (< 3600) ago.

    Returns (expression, that last fire time): its lateness is under the test's control, and the
    next fire is far enough away that no other one comes due while the test runs.
    """
    latest = (db_now() - timedelta(seconds=seconds)).replace(microsecond=0)
    return f"{latest.second} {latest.minute} * * * *", latest
