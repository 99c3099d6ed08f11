"""Several sweepers at once (Celery beat on two replicas, an operator's ``manage.py sweep``):
every lapsed lease is settled exactly once. (A renewal or completion landing between one
sweep's read and its write: tests/leases/test_expiry.py injects it at that exact point.)"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection

from actions.leases.expiry import sweep_expired_leases
from actions.runs import sweep_due_retries
from actions.sweeps import run_cycle
from audit.models import Event
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.concurrency.threads import LockHolder, race
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim, expire_lease, start

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_three_sweepers_settle_each_lapsed_lease_exactly_once():
    session = register(enrolled_worker(), max_concurrent=8)
    revision = make_revision(max_attempts=2, lost_retry="idempotent")
    runs = [enqueue(revision) for _ in range(8)]
    held = claim(session, 8)
    for index, lease in enumerate(held):
        if index % 2 == 0:
            start(lease)  # half started (→ lost, retry_wait), half not (→ back to the queue)
        expire_lease(lease.attempt_id)

    results = race(*[sweep_expired_leases] * 3)

    assert all(kind == "ok" for kind, _ in results), results
    assert sum(value for _, value in results) == 8
    released = Counter(Event.objects.filter(kind="lease.released").values_list("lease_id", flat=True))
    assert len(released) == 8 and set(released.values()) == {1}
    assert not RunDispatchLease.objects.filter(state="leased").exists()
    states = Counter(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("state", flat=True))
    assert states == {"retry_wait": 4, "dispatching": 4}
    assert Counter(RunAttempt.objects.values_list("state", flat=True)) == {"lost": 4, "claimed": 4}
    assert Event.objects.filter(kind="run.retry_wait").count() == 4
    assert sweep_due_retries() == 0


@pytest.mark.postgres
def test_a_lease_whose_worker_stays_locked_is_left_for_the_next_cycle_and_the_rest_are_settled():
    busy, idle = register(enrolled_worker()), register(enrolled_worker())
    revision = make_revision()
    enqueue(revision), enqueue(revision)
    stuck, free = start(claim(busy)[0]), start(claim(idle)[0])
    expire_lease(stuck.attempt_id), expire_lease(free.attempt_id)
    holder = LockHolder(busy.worker.worker_id)  # e.g. a long claim of that worker
    holder.start()
    assert holder.locked.wait(10)

    def sweep_with_a_short_lock_timeout():
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        return run_cycle()

    try:
        [(kind, report)] = race(sweep_with_a_short_lock_timeout)
    finally:
        holder.release.set()
        holder.join(10)
    assert kind == "ok", report
    assert report.leases_settled == 1
    assert (stuck.lease().state, free.lease().state) == ("leased", "released")
    assert sweep_expired_leases() == 1  # the next cycle settles it
    assert stuck.lease().release_reason == "lease_expired"
