"""The two things that run the sweep cycle admit due fires on their own: the in-process loop of
``manage.py serve`` (standalone) and Celery beat (cluster profile: a real ``celery worker --beat``
process on Redis, pointed at this test's database)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection

from actions.sweeps import loop
from core.db import db_now
from schedules.models import ScheduleFire
from tests.agent.processes import celery_beat
from tests.helpers import make_revision
from tests.schedules.flows import make_schedule, rewind

pytestmark = [pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def due_schedule():
    """A minutely schedule whose fire of this minute is due (later minutes may fire too)."""
    schedule = make_schedule(make_revision(), "* * * * *")
    return rewind(schedule, db_now().replace(second=0, microsecond=0))


def test_the_in_process_loop_admits_a_due_fire():
    schedule = due_schedule()
    stop = threading.Event()

    def serve_loop():
        try:
            loop(stop, 0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=serve_loop, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not ScheduleFire.objects.filter(schedule=schedule, fire_at=schedule.next_fire_at).exists():
            assert time.monotonic() < deadline, "the loop admitted nothing"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(10)
    assert ScheduleFire.objects.get(schedule=schedule, fire_at=schedule.next_fire_at).run_id is not None


@pytest.mark.redis
@pytest.mark.slow
def test_celery_beat_admits_a_due_fire(redis_url, tmp_path):
    schedule = due_schedule()
    due = ScheduleFire.objects.filter(schedule=schedule, fire_at=schedule.next_fire_at)
    with celery_beat(redis_url, tmp_path) as wait:
        wait(due.exists, "admission")
    fire = ScheduleFire.objects.get(schedule=schedule, fire_at=schedule.next_fire_at)
    assert (fire.outcome, fire.run_id is not None) == ("queued", True)
    assert fire.decided_at - fire.fire_at < timedelta(minutes=2)
