"""Cancel during ``running`` with the real agent process (ADR-0012 "the coordination
protocol between cancellation, shutdown and the Run Lease"): the cancel is recorded, the worker
learns it from its next renew answer, kills the job's whole process group within one renew
interval — even a job that ignores SIGTERM — and completes the attempt ``cancelled``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from actions.enrollment import enrollment_token_create, worker_create
from actions.runs import run_cancel
from audit.models import Event
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from tests.agent.processes import wait_for
from tests.helpers import enqueue, make_revision

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RUN_LEASE_SECONDS = 4  # the agent renews at the midpoint: every 2 s
#: Scheduling slack on a loaded CI machine: the renew round trip and the SIGTERM delivery.
SLACK_SECONDS = 0.75


def agent(state: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "QINGLONG_WORKER_LOG_LEVEL": "INFO"}
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "--state-dir", str(state), *args], cwd=ROOT, env=env, **popen
    )


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


@pytest.mark.parametrize(
    "command",
    [
        "sleep 300 & wait",  # a shell that waits on a child: both must die, the whole group
        'trap "" TERM; sleep 300 & wait',  # both ignore SIGTERM: only the SIGKILL after the grace ends them
    ],
    ids=["obeys-sigterm", "ignores-sigterm"],
)
def test_cancel_during_running_kills_the_process_group_within_one_renew_interval(
    live_server, tmp_path, protocol_settings, command
):
    # Heartbeats far apart, so that only the renew answer can carry the cancellation in time.
    protocol_settings(
        RUN_LEASE_SECONDS=RUN_LEASE_SECONDS, SESSION_LEASE_SECONDS=120, HEARTBEAT_INTERVAL_SECONDS=60
    )
    worker = worker_create(name="cancel-worker")
    issued = enrollment_token_create(worker_id=worker.pk)
    state = tmp_path / "state"
    enrolled = agent(
        state, "enroll", "--server", live_server.url, "--token", issued.token, "--worker", worker.name
    )
    assert enrolled.wait(30) == 0
    run = enqueue(
        make_revision(
            command=command,
            timeout_seconds=600,
            max_attempts=3,
            retry_on=("failed",),
            lost_retry="idempotent",
        )
    )
    process = agent(state, "run", "--poll-max", "1", "--drain-timeout", "10")
    try:
        attempt = wait_for(
            lambda: RunAttempt.objects.filter(run=run, state="running", pid__isnull=False).first(),
            what="the attempt to run",
        )
        pgid = attempt.pgid
        assert wait_for(lambda: len(group_members(pgid)) >= 2, what="the job and its child", timeout=10)
        renew_interval = RUN_LEASE_SECONDS // 2
        # The worst moment: right after a renewal, so the next renew answer is a full interval away.
        lease = RunDispatchLease.objects.get(attempt=attempt)
        wait_for(
            lambda: RunDispatchLease.objects.get(pk=lease.pk).version > lease.version,
            step=0.01,
            timeout=renew_interval * 3,
            what="a renewal",
        )

        result = run_cancel(run_id=run.pk, reason="stop it")
        cancelled_at = time.monotonic()
        assert result.status == "requested"
        wait_for(
            lambda: not group_members(pgid),
            timeout=renew_interval * 3,
            step=0.02,
            what="the process group to die",
        )
        killed_after = time.monotonic() - cancelled_at
        assert killed_after <= renew_interval + SLACK_SECONDS, killed_after

        wait_for(lambda: Run.objects.get(pk=run.pk).state == "cancelled", timeout=20, what="the run to end")
        attempt.refresh_from_db()
        assert (attempt.state, attempt.number) == ("cancelled", 1)
        assert RunAttempt.objects.filter(run=run).count() == 1  # cancelled, never retried
        assert Run.objects.get(pk=run.pk).error_class == "cancelled_by_user"
        assert Event.objects.filter(run_id=run.pk, kind="lease.completed").count() == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
