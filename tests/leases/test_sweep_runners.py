"""The three things that run the sweep cycle settle lapsed leases on their own: Celery beat on
Redis (cluster profile) — a real ``celery worker --beat`` process pointed at this test's database
— and the in-process loop of ``manage.py serve`` (standalone profile). ``manage.py sweep`` is in
test_expiry.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection

from actions.sweeps import loop
from audit.models import Event
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, expire_lease, start

pytestmark = [pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """This test's database (pytest-django's test database) as a DATABASE_URL."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(settings['NAME']).resolve()}"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    host, port = settings["HOST"] or "127.0.0.1", settings["PORT"] or 5432
    return f"postgres://{settings['USER']}{password}@{host}:{port}/{settings['NAME']}"


@pytest.mark.redis
@pytest.mark.slow
def test_celery_beat_settles_a_lapsed_lease(redis_url, tmp_path, protocol_settings):
    # Nobody heartbeats in this test: the session must outlive Celery's start on a slow machine,
    # or the sweep would settle the lease as session_expired instead.
    protocol_settings(SESSION_LEASE_SECONDS=600)
    session = register(enrolled_worker())
    run = enqueue(make_revision(max_attempts=2, lost_retry="idempotent"))
    held = start(claim_one(session))
    expire_lease(held.attempt_id)

    cluster = connection.vendor == "postgresql"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": redis_url,
        "REDIS_URL": redis_url,
        "QINGLONG_CELERY_QUEUE": f"qinglong-test-{uuid.uuid4().hex}",
        "QINGLONG_SWEEP_INTERVAL_SECONDS": "0.5",
        "QINGLONG_SESSION_LEASE_SECONDS": "600",
        "QINGLONG_VAR_DIR": str(tmp_path),
        # PostgreSQL leg: the cluster profile itself (its system checks demand PostgreSQL and Redis);
        # SQLite leg: the standalone profile may use Celery too, with any broker.
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
            while held.lease().state == "leased":
                assert process.poll() is None, f"celery exited {process.returncode}:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"no sweep within 60 s:\n{log.read_text()}"
                time.sleep(0.2)
        finally:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    lease = held.lease()
    assert (lease.state, lease.release_reason) == ("released", "lease_expired")
    assert held.attempt().state == "lost"
    run.refresh_from_db()
    assert run.state == "retry_wait"
    settled_by = Event.objects.get(kind="lease.released", lease_id=lease.pk)
    assert settled_by.actor_type == "reconciler"
    text = log.read_text()
    assert "qinglong.tasks.sweep_cycle" in text and "succeeded" in text, text


def test_the_in_process_loop_settles_a_lapsed_lease():
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = claim_one(session)  # never ACKed: the dispatch timeout returns it to the queue
    expire_lease(held.attempt_id)
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
        while held.lease().state == "leased":
            assert time.monotonic() < deadline, "the loop settled nothing"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert (held.lease().release_reason, held.attempt().state) == ("dispatch_timeout", "claimed")
