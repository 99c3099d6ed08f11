"""A job never outlives its agent: SIGKILL the agent mid-run and the job's whole process group
dies within the guard's poll and grace (agent/guard.py), so the control plane's retry of the lost
attempt can never run beside it."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest

from actions.enrollment import enrollment_token_create, worker_create
from core.db import db_now
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.agent.processes import wait_for
from tests.agent.test_cancel_running import agent, group_members
from tests.helpers import enqueue, make_revision

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: The paused agent's hard deadline past its lease (docs/leases.md, Hard deadline), seconds.
LOST_AFTER = 4


@pytest.mark.parametrize("command", ["sleep 300 & wait", "trap '' TERM; sleep 300 & wait"])
def test_killing_the_agent_ends_its_jobs_process_group(live_server, tmp_path, command):
    worker = worker_create(name="mortal-worker")
    issued = enrollment_token_create(worker_id=worker.pk)
    state = tmp_path / "state"
    assert agent(state, "enroll", "--server", live_server.url, "--token", issued.token).wait(30) == 0
    run = enqueue(
        make_revision(command=command, timeout_seconds=600, max_attempts=2, lost_retry="idempotent")
    )
    process = agent(state, "run", "--poll-max", "1")
    try:
        attempt = wait_for(
            lambda: RunAttempt.objects.filter(run=run, state="running").first(), what="the attempt to run"
        )
        assert wait_for(
            lambda: len(group_members(attempt.pgid)) >= 3, timeout=10, what="guard, shell and sleep"
        )
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        killed = time.monotonic()
        # the guard polls every 0.5 s; a job ignoring SIGTERM gets SIGKILL 2 s later
        wait_for(lambda: not group_members(attempt.pgid), timeout=5, step=0.05, what="the group to die")
        assert time.monotonic() - killed < 4
        assert Run.objects.get(pk=run.pk).state == "running"  # the control plane learns it later
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_paused_agents_job_ends_before_its_hard_deadline(live_server, tmp_path, protocol_settings):
    """SIGSTOP the agent: it cannot renew, so its job's guard ends the job before the hard deadline
    of the lease the control plane granted (its expiry + ``lostAfterSeconds``, the moment before
    which the attempt is never retried: docs/leases.md, Hard deadline) — the retry can never
    overlap it."""
    protocol_settings(RUN_LEASE_SECONDS=8, SESSION_LEASE_SECONDS=120, HEARTBEAT_INTERVAL_SECONDS=30)
    worker = worker_create(name="paused-worker")
    issued = enrollment_token_create(worker_id=worker.pk)
    state = tmp_path / "state"
    assert agent(state, "enroll", "--server", live_server.url, "--token", issued.token).wait(30) == 0
    run = enqueue(
        make_revision(command="sleep 300 & wait", timeout_seconds=600, lost_after_seconds=LOST_AFTER)
    )
    process = agent(state, "run", "--poll-max", "1")
    try:
        attempt = wait_for(
            lambda: RunAttempt.objects.filter(run=run, state="running").first(), what="the attempt to run"
        )
        lease = RunDispatchLease.objects.get(attempt=attempt)
        renewed = wait_for(
            lambda: RunDispatchLease.objects.filter(pk=lease.pk, version__gt=lease.version).first(),
            timeout=15,
            step=0.02,
            what="a renewal",
        )
        process.send_signal(signal.SIGSTOP)
        wait_for(
            lambda: not group_members(attempt.pgid),
            timeout=15 + LOST_AFTER,
            step=0.05,
            what="the group to die",
        )
        # gone before the hard deadline, before which the control plane retries nothing
        assert db_now() < renewed.expires_at + timedelta(seconds=LOST_AFTER)
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()
