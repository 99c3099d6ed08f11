"""The two things that run the sweep cycle admit due fires on their own: the in-process loop of
``manage.py serve`` (standalone) and Celery beat (cluster profile: a real ``celery worker --beat``
process on Redis, pointed at this test's database)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection

from actions.sweeps import loop
from core.db import db_now
from schedules.models import ScheduleFire
from tests.agent.processes import database_url
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
    cluster = connection.vendor == "postgresql"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": redis_url,
        "REDIS_URL": redis_url,
        "QINGLONG_CELERY_QUEUE": f"qinglong-test-{uuid.uuid4().hex}",
        "QINGLONG_SWEEP_INTERVAL_SECONDS": "0.5",
        "QINGLONG_VAR_DIR": str(tmp_path),
        "QINGLONG_PROFILE": "cluster-control" if cluster else "standalone",
        "DJANGO_SECRET_KEY": "celery-beat-test-only",
    }
    env.pop("QINGLONG_TEST_LEG", None)
    log = tmp_path / "celery.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "qinglong",
                "worker",
                "--beat",
                "--pool=solo",
                "--loglevel=INFO",
                f"--schedule={tmp_path / 'beat-schedule'}",
                "-Q",
                env["QINGLONG_CELERY_QUEUE"],
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while not ScheduleFire.objects.filter(schedule=schedule, fire_at=schedule.next_fire_at).exists():
                assert process.poll() is None, f"celery exited {process.returncode}:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"no admission within 60 s:\n{log.read_text()}"
                time.sleep(0.2)
        finally:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    fire = ScheduleFire.objects.get(schedule=schedule, fire_at=schedule.next_fire_at)
    assert (fire.outcome, fire.run_id is not None) == ("queued", True)
    assert fire.decided_at - fire.fire_at < timedelta(minutes=2)
