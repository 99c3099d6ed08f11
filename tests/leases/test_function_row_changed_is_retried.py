"""A lease function that finds a row changed under it is run again, not answered 500
(``core.db.write_path``; ``QL409`` in leases 0004…0011).

``ql_lease_claim`` reads the attempt after locking its run, then writes it with a compare-and-swap
on its version. If another transaction changed the attempt in between (one that did not take the
run's lock), the write matches no row and the function raises ``QL409``: everything it did rolls
back. That was a raw ``DatabaseError`` to the caller (a 500 at the API) for a race that a second
run of the same call settles by reading the row again.

Real concurrency: a second connection updates the attempt (holding its row lock, uncommitted) and
commits while the claim's write waits for that lock.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection

from actions.leases import claims
from audit.models import Event
from leases.models import RunDispatchLease
from runs.models import RunAttempt
from tests.concurrency.threads import libpq_params, waits_on_a_lock
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def test_a_claim_whose_attempt_changed_under_its_write_is_run_again_and_claims_once(
    protocol_settings, monkeypatch
):
    protocol_settings(DISPATCH_HOLD_SECONDS=0)  # the function answers alone
    session = register(enrolled_worker())
    run = enqueue(make_revision())
    attempt = RunAttempt.objects.get(run=run)
    sqlstates: list[str | None] = []
    real = claims.call_function

    def recording(sql, params):
        try:
            return real(sql, params)
        except Exception as exc:
            sqlstates.append(getattr(exc.__cause__, "sqlstate", None))
            raise

    monkeypatch.setattr(claims, "call_function", recording)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        claimer_pid = cursor.fetchone()[0]
    blocker = psycopg.connect(**libpq_params())
    blocker.execute("UPDATE runs_runattempt SET version = version + 1 WHERE id = %s", [attempt.pk])

    def commit_once_the_claim_waits() -> None:
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not waits_on_a_lock(claimer_pid):
                time.sleep(0.02)
            blocker.commit()
        finally:
            connection.close()  # this thread's own

    committer = threading.Thread(target=commit_once_the_claim_waits, daemon=True)
    committer.start()
    try:
        held = claim_one(session)
    finally:
        committer.join(30)
        blocker.close()

    assert "QL409" in sqlstates, sqlstates  # the first call met the change ...
    assert held.run_id == run.pk  # ... and the call run again claimed the attempt
    lease = RunDispatchLease.objects.get()
    assert (lease.attempt_id, lease.lease_generation) == (attempt.pk, 1)
    assert RunAttempt.objects.get(pk=attempt.pk).version == attempt.version + 2  # the blocker's, the claim's
    assert Event.objects.filter(kind="lease.claimed").count() == 1
