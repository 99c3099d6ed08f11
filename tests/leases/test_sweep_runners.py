"""The three things that run the sweep cycle settle lapsed leases on their own: Celery beat on
Redis (cluster profile) — a real ``celery worker --beat`` process pointed at this test's database
— and the in-process loop of ``manage.py serve`` (standalone profile). ``manage.py sweep`` is in
test_expiry.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from actions.sweeps import loop
from audit.models import Event
from tests.agent.processes import celery_beat
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, expire_lease, start

pytestmark = [pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


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

    with celery_beat(redis_url, tmp_path, QINGLONG_SESSION_LEASE_SECONDS="600") as wait:
        wait(lambda: held.lease().state != "leased", "sweep")

    lease = held.lease()
    assert (lease.state, lease.release_reason) == ("released", "lease_expired")
    assert held.attempt().state == "lost"
    run.refresh_from_db()
    assert run.state == "retry_wait"
    settled_by = Event.objects.get(kind="lease.released", lease_id=lease.pk)
    assert settled_by.actor_type == "reconciler"
    text = (tmp_path / "celery.log").read_text()
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
