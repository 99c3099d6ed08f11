"""Acceptance (b) and (c) of docs/leases.md, Hard deadline and Outages, with real agents and their
real job guards against a real ``manage.py serve``:

(b) the control plane is down for twice the lease TTL: the jobs keep running through it and
    finish once — one attempt each, succeeded, no lost mark;
(c) one worker is partitioned (a TCP proxy in the test drops its traffic) while the control plane
    stays up: its attempt is settled lost after its lease expired, the retry is not due before the
    hard deadline, and the retry's job starts only after the partitioned worker's guard ended the
    job — checked with the job's own timestamps (worker side) against the attempts' times in the
    database (server side), both read from this host's clock.
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest

from actions.enrollment import enrollment_token_create, worker_create
from audit.liveness import SERVING
from audit.models import ControlPlaneBeat, Event
from core.db import db_now
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.agent.cluster import TcpProxy, free_ports
from tests.agent.processes import ControlPlane, wait_for
from tests.agent.test_cancel_running import agent
from tests.helpers import enqueue, make_revision

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE_TTL = 8
HEARTBEAT = 3
GRACE = HEARTBEAT + 10
TIMINGS = {
    "RUN_LEASE_SECONDS": LEASE_TTL,
    "SESSION_LEASE_SECONDS": LEASE_TTL + 2,  # the system check wants ≥ 3 heartbeats (± jitter)
    "HEARTBEAT_INTERVAL_SECONDS": HEARTBEAT,
    "OUTAGE_GRACE_SECONDS": float(GRACE),
    "LIVENESS_BEAT_SECONDS": 1.0,
    "OUTAGE_AFTER_SECONDS": 3.0,
    "DISPATCH_HOLD_SECONDS": 0,
}


def _plane(tmp_path, protocol_settings) -> ControlPlane:
    protocol_settings(**TIMINGS)
    return ControlPlane(tmp_path, **{f"QINGLONG_{key}": str(value) for key, value in TIMINGS.items()})


def _enroll(tmp_path, name: str, server: str):
    worker = worker_create(name=name)
    token = enrollment_token_create(worker_id=worker.pk).token
    state = tmp_path / name
    assert agent(state, "enroll", "--server", server, "--token", token).wait(30) == 0
    return state


def _ticks(path) -> dict[int, list[float]]:
    """pid → the job's own timestamps (``date +%s.%N``) from the ticks file."""
    by_pid: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        pid, stamp, *_ = line.split()
        by_pid.setdefault(int(pid), []).append(float(stamp))
    return by_pid


def test_real_agents_jobs_ride_out_an_outage_of_twice_the_lease_and_finish_once(tmp_path, protocol_settings):
    plane = _plane(tmp_path, protocol_settings)
    plane.start()
    ticks = tmp_path / "ticks"
    job = f"for i in $(seq 1 {5 * LEASE_TTL}); do echo $$ $(date +%s.%N) >> {ticks}; sleep 1; done"
    revision = make_revision(command=job, timeout_seconds=600, lost_after_seconds=4 * LEASE_TTL)
    runs = [enqueue(revision) for _ in range(2)]
    states = [_enroll(tmp_path, f"outage-{n}", plane.url) for n in range(2)]
    processes = [agent(state, "run", "--poll-max", "1") for state in states]
    try:
        wait_for(
            lambda: RunAttempt.objects.filter(state="running").count() == 2,
            timeout=60,
            what="two jobs running",
        )
        # The premise: the control plane served and beat its liveness row before it went down
        # (a flushed test database has no row, and with none every lapse counts).
        wait_for(
            lambda: ControlPlaneBeat.objects.filter(
                name=SERVING, beat_at__gte=db_now() - timedelta(seconds=2)
            ).exists(),
            timeout=30,
            what="the control plane's liveness beat",
        )
        plane.stop()
        down = time.time()
        time.sleep(2 * LEASE_TTL)
        plane.start()
        up = time.time()
        wait_for(
            lambda: Run.objects.filter(state="succeeded").count() == 2,
            timeout=6 * LEASE_TTL + GRACE,
            what="both runs to succeed",
        )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        plane.stop()
    assert RunAttempt.objects.count() == 2  # one attempt each: no retry
    assert Event.objects.filter(kind__in=("attempt.lost", "session.expired")).count() == 0
    by_pid = _ticks(ticks)
    assert len(by_pid) == 2, "each job ran exactly once"
    for stamps in by_pid.values():
        assert min(stamps) < down and max(stamps) > up  # it ran through the outage
        assert len(stamps) == 5 * LEASE_TTL  # ...and to its end
    assert {run.pk for run in runs} == set(Run.objects.filter(state="succeeded").values_list("pk", flat=True))


def test_a_partitioned_workers_attempt_is_retried_only_after_its_guard_ended_the_job(
    tmp_path, protocol_settings
):
    lost_after = 6
    plane = _plane(tmp_path, protocol_settings)
    plane.start()
    (proxy_port,) = free_ports(17200, 17299, 1)
    proxy = TcpProxy(proxy_port, plane.port)
    ticks = tmp_path / "ticks"
    # The first attempt ticks until it is ended; a retry finds ticks, notes its start and succeeds.
    job = (
        f"if [ -s {ticks} ]; then echo $$ $(date +%s.%N) retry >> {ticks}; exit 0; fi; "
        f"while true; do echo $$ $(date +%s.%N) >> {ticks}; sleep 0.2; done"
    )
    run = enqueue(
        make_revision(
            command=job,
            timeout_seconds=600,
            max_attempts=2,
            lost_retry="idempotent",
            lost_after_seconds=lost_after,
        )
    )
    cut_off = _enroll(tmp_path, "partitioned", f"http://127.0.0.1:{proxy_port}")
    other = _enroll(tmp_path, "healthy", plane.url)
    first_agent = agent(cut_off, "run", "--poll-max", "1")
    second_agent = None
    try:
        first = wait_for(
            lambda: RunAttempt.objects.filter(run=run, state="running").first(), what="attempt 1"
        )
        wait_for(lambda: ticks.exists() and ticks.read_text(), what="the job's first tick")
        proxy.partitioned.set()
        partitioned_at = time.time()
        second_agent = agent(other, "run", "--poll-max", "1")
        retry = wait_for(
            lambda: RunAttempt.objects.filter(run=run, number=2, state__in=("running", "succeeded")).first(),
            timeout=3 * LEASE_TTL + lost_after + 30,
            what="the retry to start on the healthy worker",
        )
        wait_for(
            lambda: Run.objects.get(pk=run.pk).state == "succeeded", timeout=30, what="the retry to succeed"
        )
    finally:
        for process in (first_agent, second_agent):
            if process is not None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:  # the partitioned one cannot drain: it never hears back
                    process.kill()
                    process.wait(10)
        proxy.close()
        plane.stop()
    first.refresh_from_db()
    retry.refresh_from_db()
    lease = RunDispatchLease.objects.get(attempt=first)
    assert (first.state, lease.release_reason) == ("lost", "lease_expired")
    # server side: settled once the lease expired; retry not before the hard deadline
    assert lease.ended_at >= lease.expires_at
    hard_deadline = lease.expires_at + timedelta(seconds=lost_after)
    assert retry.started_at > hard_deadline
    # worker side: the partitioned job's own last tick came before the retry's job began
    by_pid = _ticks(ticks)
    assert len(by_pid) == 2, by_pid.keys()
    first_pid, retry_pid = sorted(by_pid, key=lambda pid: min(by_pid[pid]))
    last_tick = datetime.fromtimestamp(max(by_pid[first_pid]), UTC)
    retry_began = datetime.fromtimestamp(min(by_pid[retry_pid]), UTC)
    assert last_tick < retry_began, (last_tick, retry_began)
    assert last_tick < hard_deadline  # the guard ended it before the deadline the server honours
    assert last_tick < retry.started_at
    # the job outlived the lease (no answer is not a refusal) but not the deadline
    assert last_tick > lease.expires_at - timedelta(seconds=1)
    assert datetime.fromtimestamp(partitioned_at, UTC) < last_tick
    assert db_now() > hard_deadline
    after = [
        (m - lease.expires_at).total_seconds()
        for m in (last_tick, hard_deadline, retry_began, retry.started_at)
    ]
    print(  # the figures for the closing note: seconds after the lease's expiry
        f"partition: last tick of attempt 1 at {after[0]:+.1f}s, hard deadline {after[1]:+.1f}s, "
        f"retry's job began {after[2]:+.1f}s, retry started (server) {after[3]:+.1f}s"
    )
