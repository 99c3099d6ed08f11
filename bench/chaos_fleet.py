"""The half of ``make chaos`` (bench/chaos.py) that imports Django models: simulated workers with
running leases on the private database. bench/chaos.py imports it once ``django.setup()`` has run."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings

from core.db import db_now
from leases.models import RunDispatchLease
from tests.agent.fleet import Fleet, SimulatedWorker
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, start
from workers.models import WorkerSession


def simulated_fleet(server: str, count: int, *, heartbeat: float, lease: float) -> Fleet:
    """``count`` workers, each with a session and one running attempt (set up under long leases,
    then started afresh as if each had just renewed on its own schedule), driven against ``server``
    with ``heartbeat`` and ``lease`` (seconds) as the control plane runs them."""
    settings.QINGLONG = {**settings.QINGLONG, "RUN_LEASE_SECONDS": 3600, "SESSION_LEASE_SECONDS": 3600}
    revision = make_revision("chaos-simulated", max_attempts=2, lost_retry="idempotent", timeout_seconds=3600)
    workers = []
    for _ in range(count):
        worker = enrolled_worker()
        session = register(worker, max_concurrent=1)
        enqueue(revision)
        held = start(claim_one(session))
        workers.append(
            SimulatedWorker(
                worker,
                session.session_id,
                session.generation,
                session.version,
                held.attempt_id,
                held.lease_generation,
                held.ticket.token,
                held.lease_version,
            )
        )
    fleet = Fleet(server, workers, heartbeat_seconds=heartbeat, renew_seconds=lease / 2 - 2, threads=8)
    now = db_now()
    for w in workers:
        WorkerSession.objects.filter(pk=w.session_id).update(
            lease_expires_at=now + timedelta(seconds=w.first_heartbeat + lease / 2 - 0.5)
        )
        RunDispatchLease.objects.filter(attempt_id=w.attempt_id).update(
            expires_at=now + timedelta(seconds=w.first_renew + lease / 2)
        )
    return fleet
