"""A claim that the server function committed is answered — even when another claim emptied the
process's template cache while the call was in flight (``actions.leases.claims``).

Since the lease calls run as one statement in autocommit (``core.db.write_path``'s database path),
``ql_lease_claim`` has *committed* the lease, the attempt's dispatch and the run's move by the time
Python reads the answer. The offer was then built from ``_templates[revision]`` (now: from the
templates the call was made with). That cache is bounded: at ``_CACHE_LIMIT`` entries the next
revision learnt clears it. A second claim (another worker, another revision) that learns its
template while the first call waits for its worker's row lock therefore removed the template the
first call was made with, and the first claim raised ``KeyError`` *after* its commit: the worker
gets a 500 for a lease it holds (capacity used, the run ``dispatching``) until the dispatch timeout
takes it back (the agent drops the offers of a refused claim and offers fresh ones). Before that
change the KeyError was already a 500, but it rolled the claim back (checked on 5f2485f: the same
test fails there with no lease written).

Real concurrency: the first claim runs on its own thread and connection and is observed blocked on
the worker-row lock a second connection holds (``LockHolder``), the second claim runs on the main
thread's connection. The cache is filled up to its real limit with unusable entries (what a
long-lived process that has seen 4096 revisions holds); the limit itself is not changed.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection

from actions.leases import claims
from leases.models import RunDispatchLease
from tests.concurrency.threads import LockHolder, waits_on_a_lock
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim, claim_one, complete, start

# PostgreSQL only: the template cache serves ql_lease_claim's answers; SQLite's Python path builds
# the spec itself (and there the lock holder would hold the whole database's write lock).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def test_a_committed_claim_is_answered_when_the_template_cache_is_cleared_during_the_call(
    protocol_settings, monkeypatch
):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # no claim ranking: the function answers alone
    monkeypatch.setattr(claims, "_templates", {})
    first = register(enrolled_worker())
    second = register(enrolled_worker())
    x = make_revision()
    y = make_revision()
    enqueue(x)
    complete(start(claim_one(first)))  # this process learns the class and x's template
    assert x.pk in claims._templates
    # A long-lived process: the cache at its limit (x and revisions it could not template).
    while len(claims._templates) < claims._CACHE_LIMIT:
        claims._templates[uuid.uuid4()] = None
    x_run = enqueue(x)  # for the first worker
    enqueue(y, priority=5)  # for the second: first in the queue, its template not yet known

    holder = LockHolder(first.worker.worker_id)
    holder.start()
    assert holder.locked.wait(10)
    outcome: dict = {}
    ready = threading.Event()

    def first_claims():
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            ready.set()
            outcome["offers"] = claim(first)
        except Exception as exc:  # asserted below
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=first_claims, daemon=True)
    thread.start()
    assert ready.wait(10)
    deadline = time.monotonic() + 10
    while not waits_on_a_lock(outcome["pid"]):
        assert time.monotonic() < deadline, "the first claim never waited on the worker lock"
        time.sleep(0.02)
    # Meanwhile the second worker claims y: learning y's template clears the full cache.
    held_y = claim(second)
    assert [h.run_id for h in held_y] != [x_run.pk]
    holder.release.set()
    thread.join(30)
    holder.join(10)
    assert not thread.is_alive(), "the first claim hung"

    leases = list(RunDispatchLease.objects.filter(worker_id=first.worker.worker_id, run_id=x_run.pk))
    assert "error" not in outcome, (
        f"the first claim failed with {outcome['error']!r} although it committed "
        f"{len(leases)} lease(s) for the run: {[(lease.state, lease.lease_generation) for lease in leases]}"
    )
    assert [h.run_id for h in outcome["offers"]] == [x_run.pk]
