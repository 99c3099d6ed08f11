"""The activation ACKs and the completion read the database clock after the worker lock
(ADR-0012 §6; docs/leases.md, Locks and transactions): an ACK that waited behind a held worker
row stamps the lease with a time no earlier than the moment the lock was given up — on
PostgreSQL through ``ql_lease_ack``/``ql_lease_complete``, on SQLite through the ORM path."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from core.db import db_now
from tests.concurrency.threads import LockHolder, waits_on_a_lock
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, running, starting

pytestmark = [pytest.mark.django_db(transaction=True)]


def _behind_the_worker_lock(held, call):
    """Run ``call(held)`` on its own connection while another holds the worker row; return the
    database time just before the lock was given up."""
    holder = LockHolder(held.session.worker.worker_id)
    holder.start()
    assert holder.locked.wait(10)
    outcome: dict = {}
    ready = threading.Event()

    def caller():
        try:
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    outcome["pid"] = cursor.fetchone()[0]
            ready.set()
            outcome["answer"] = call(held)
        except Exception as exc:  # asserted below
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=caller, daemon=True)
    thread.start()
    assert ready.wait(10)
    if connection.vendor == "postgresql":
        deadline = time.monotonic() + 10
        while not waits_on_a_lock(outcome["pid"]):
            assert time.monotonic() < deadline, "the call never waited on the worker lock"
            time.sleep(0.02)
    time.sleep(0.2)
    assert "answer" not in outcome and "error" not in outcome  # still waiting
    released = db_now()
    holder.release.set()
    thread.join(20)
    holder.join(10)
    assert "error" not in outcome, outcome.get("error")
    return released


@pytest.mark.parametrize(
    ("call", "stamp"),
    [(starting, "starting_at"), (running, "running_at"), (lambda held: complete(held), "ended_at")],
    ids=["starting", "running", "complete"],
)
def test_an_ack_that_waited_for_the_worker_lock_stamps_the_time_after_it(call, stamp):
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = claim_one(session)
    if stamp != "starting_at":
        starting(held)
    if stamp == "ended_at":
        running(held)
    released = _behind_the_worker_lock(held, call)
    assert getattr(held.lease(), stamp) >= released
