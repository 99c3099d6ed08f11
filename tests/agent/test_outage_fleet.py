"""Acceptance (a) of docs/leases.md, Outages: 200 workers with running leases, the control plane down
for twice the lease TTL, then back → no lost mark, no retry, every heartbeat and renewal after the
recovery succeeds within the grace window, and every run finishes succeeded.

The workers are simulated in this process (``tests.agent.fleet``: a few threads, one schedule, the
real signed protocol over HTTP against a real ``manage.py serve``); their sessions and attempts are
set up through the actions first, with the same timings the server runs with.

Deadlines come from the protocol's own timings: a worker must renew within one lease TTL, so a
server too slow to answer 200 workers' calls in time would lapse leases *while serving* — the
test reports that apart from an outage failure (``slow_calls``), so a failure under machine load is
diagnosed as load, not mistaken for the product.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from audit.models import ControlPlaneBeat, Event
from core.db import db_now
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.agent.fleet import Fleet, SimulatedWorker
from tests.agent.processes import ControlPlane, wait_for
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, start
from workers.models import WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.solo]

WORKERS = 200
LEASE_TTL = 20  # run lease and session lease, seconds (15 s lapsed under a loaded machine before any fault)
HEARTBEAT = 6  # about a third of the session lease, as the profiles have it
GRACE = HEARTBEAT + 10  # the setting's default formula: one heartbeat interval + the agent's backoff
TIMINGS = {
    "RUN_LEASE_SECONDS": LEASE_TTL,
    "SESSION_LEASE_SECONDS": LEASE_TTL,
    "HEARTBEAT_INTERVAL_SECONDS": HEARTBEAT,
    "OUTAGE_GRACE_SECONDS": float(GRACE),
    "LIVENESS_BEAT_SECONDS": 1.0,
    "OUTAGE_AFTER_SECONDS": 3.0,
    "DISPATCH_HOLD_SECONDS": 0,
    "RATE_WORKER": "6000/m",
}


def _fleet_setup(protocol_settings) -> list[SimulatedWorker]:
    # Setting 200 workers up takes longer than a lease: do it under long leases (so the server's
    # sweeps leave them alone meanwhile), then start every session and lease afresh together, one
    # TTL from now on the database clock, as if all had just renewed.
    protocol_settings(RUN_LEASE_SECONDS=3600, SESSION_LEASE_SECONDS=3600)
    revision = make_revision(max_attempts=2, lost_retry="idempotent", timeout_seconds=3600)
    workers = []
    for _ in range(WORKERS):
        worker = enrolled_worker()
        session = register(worker, max_concurrent=1)
        enqueue(revision)
        held = start(claim_one(session))
        workers.append(
            SimulatedWorker(
                worker=worker,
                session_id=session.session_id,
                generation=session.generation,
                session_version=session.version,
                attempt_id=held.attempt_id,
                lease_generation=held.lease_generation,
                lease_token=held.ticket.token,
                lease_version=held.lease_version,
            )
        )
    protocol_settings(**TIMINGS)
    return workers


def _as_if_just_renewed(workers: list[SimulatedWorker]) -> None:
    """Each session and lease runs out as if the worker had just renewed on its own schedule:
    the session's first heartbeat finds it past its midpoint (so it is extended then), the lease's
    first renewal comes at its midpoint — the spread the agents' own timers would have."""
    now = db_now()
    for worker in workers:
        WorkerSession.objects.filter(pk=worker.session_id).update(
            lease_expires_at=now + timedelta(seconds=worker.first_heartbeat + LEASE_TTL / 2 - 0.5)
        )
        RunDispatchLease.objects.filter(attempt_id=worker.attempt_id).update(
            expires_at=now + timedelta(seconds=worker.first_renew + LEASE_TTL / 2)
        )


def _diagnosis(workers: list[SimulatedWorker], fleet: Fleet, up_at: float) -> str:
    """Why workers were refused: the liveness row, the refused sessions' lease and end, their calls."""
    beat = ControlPlaneBeat.objects.values().first()
    now = db_now()
    lines = [f"\nliveness row: {beat}; db now {now}; test clock: recovery at {up_at:.1f}"]
    for index, worker in [(i, w) for i, w in enumerate(workers) if w.refusals][:5]:
        session = WorkerSession.objects.values("lease_expires_at", "ended_at", "state").get(
            pk=worker.session_id
        )
        calls = [
            (c.kind, round(c.sent - up_at, 1), round(c.answered - up_at, 1), c.code)
            for c in fleet.calls
            if c.worker == index
        ][-4:]
        lines.append(f"worker {index}: session {session}; last calls (kind, sent, answered, code): {calls}")
    return "\n".join(lines)


def test_two_hundred_workers_ride_out_a_control_plane_outage_of_twice_the_lease(tmp_path, protocol_settings):
    protocol_settings(**TIMINGS)
    env = {f"QINGLONG_{key}": str(value) for key, value in TIMINGS.items()}
    plane = ControlPlane(tmp_path, **env)
    plane.start()
    began = time.monotonic()
    workers = _fleet_setup(protocol_settings)
    print(f"set up {WORKERS} workers in {time.monotonic() - began:.1f}s")
    fleet = Fleet(
        plane.url, workers, heartbeat_seconds=HEARTBEAT, renew_seconds=LEASE_TTL / 2 - 2, backoff_max=4.0
    )
    _as_if_just_renewed(workers)
    fleet.start()
    try:
        time.sleep(LEASE_TTL)  # one full lease of normal traffic: every worker renewed at least once
        healthy = [c for c in fleet.calls if c.code != "ok"]
        assert not healthy, f"refused before any outage (load, not the outage): {healthy[:5]}"
        plane.stop()
        down_at = time.monotonic()
        time.sleep(2 * LEASE_TTL)
        plane.start()
        up_at = time.monotonic()
        # Every worker's next heartbeat and renewal after the recovery: within the grace window.
        wait_for(
            lambda: (
                all(
                    any(c.worker == i and c.kind == kind and c.answered > up_at for c in fleet.calls)
                    for i in range(WORKERS)
                    for kind in ("heartbeat", "renew")
                )
                or any(w.stopped for w in workers)
            ),
            timeout=GRACE + 2 * HEARTBEAT,
            what="a heartbeat and a renewal of every worker after the recovery",
        )
        refusals = [(i, w.refusals) for i, w in enumerate(workers) if w.refusals]
        assert not refusals, f"{len(refusals)} workers refused after the outage: {refusals[:5]}" + _diagnosis(
            workers, fleet, up_at
        )
        after = [c for c in fleet.calls if c.answered > up_at]
        late = [c for c in after if c.sent < up_at and c.answered - up_at > GRACE]
        assert not late, f"answered only after the grace window: {late[:5]}"
        firsts = {}
        for c in sorted(after, key=lambda c: c.answered):
            firsts.setdefault((c.worker, c.kind), c.answered - up_at)
        slowest = max(firsts.values())
        assert slowest <= GRACE, f"a worker reached the control plane {slowest:.1f}s after recovery"
        fleet.finish()
        wait_for(fleet.done, timeout=LEASE_TTL + 2 * HEARTBEAT, what="every worker's completion")
    finally:
        fleet.stop()
        plane.stop()
    refusals = [(i, w.refusals) for i, w in enumerate(workers) if w.refusals]
    assert not refusals, f"{len(refusals)} workers refused: {refusals[:5]}"
    assert Event.objects.filter(kind="attempt.lost").count() == 0
    assert Event.objects.filter(kind="session.expired").count() == 0
    assert RunAttempt.objects.filter(number__gt=1).count() == 0, "a run was retried"
    states = dict.fromkeys(Run.objects.values_list("state", flat=True).distinct(), 0)
    for state in Run.objects.values_list("state", flat=True):
        states[state] += 1
    assert states == {"succeeded": WORKERS}, states
    print(  # the figures for the closing note
        f"outage {up_at - down_at:.1f}s, slowest first call after recovery {slowest:.1f}s (grace {GRACE}s), "
        f"{len(fleet.calls)} calls"
    )
