"""Restarting the standalone control plane under a running agent refuses nothing (issue 16):
replay nonces live in the database (``workers.nonces``), so the new process accepts the agent's
next signed request at once — no 503, no warning line on either side — and the agent keeps its
session. Real processes: ``manage.py serve`` (Granian) on the test database and the agent.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from actions.enrollment import enrollment_token_create, worker_create
from runs.models import Run
from tests.agent.processes import Agent, ControlPlane, wait_for
from tests.helpers import enqueue, make_revision
from workers.models import WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUN_ARGS = ("run", "--poll-max", "1", "--backoff-max", "1", "--timeout", "5", "--drain-timeout", "10")
#: An access-log line answering 503, or any line at WARNING or above.
REFUSAL = re.compile(r" 503 |\b(WARNING|ERROR|CRITICAL)\b")


def finished(run) -> Run | None:
    run = Run.objects.get(pk=run.pk)
    return run if run.state in ("succeeded", "failed", "timed_out", "cancelled") else None


def test_restarting_the_standalone_control_plane_under_a_running_agent_refuses_nothing(tmp_path):
    plane = ControlPlane(
        tmp_path, QINGLONG_HEARTBEAT_INTERVAL_SECONDS="1", QINGLONG_SESSION_LEASE_SECONDS="90"
    )
    plane.start()
    agent = Agent(tmp_path / "state", tmp_path)
    try:
        worker = worker_create(name=f"restart-{os.getpid()}")
        token = enrollment_token_create(worker_id=worker.pk).token
        assert agent.start("enroll", "--server", plane.url, "--token", token).wait(30) == 0, agent.log()
        agent.start(*RUN_ARGS)
        wait_for(
            lambda: WorkerSession.objects.filter(worker=worker, state="online").first(), what="a session"
        )

        for _ in range(2):  # two restarts, each while the agent heartbeats every second
            plane.stop()
            plane.start()
            # the new process takes the agent's signed calls (a loaded host restarts slowly)
            wait_for(lambda: plane.log().count("POST /api/v1/worker/session/heartbeat 200") >= 2, timeout=60)
        run = enqueue(make_revision(command="echo after-restarts"))
        done = wait_for(lambda: finished(run), what="a run after the restarts")
        assert done.state == "succeeded"
    finally:
        plane.stop()
        agent.kill()

    assert list(WorkerSession.objects.filter(worker=worker).values_list("generation", flat=True)) == [1]
    logs = sorted(tmp_path.glob("serve-*.log"), key=lambda path: int(path.stem.split("-")[1]))
    assert len(logs) >= 3  # the first start and two restarts (a port taken meanwhile adds one)
    for path in logs[-2:]:  # each restarted process took the agent's signed calls at once
        assert "POST /api/v1/worker/session/heartbeat 200" in path.read_text(errors="replace"), path.name
    for path in logs:
        refusals = [line for line in path.read_text(errors="replace").splitlines() if REFUSAL.search(line)]
        assert not refusals, f"{path.name}: {refusals[:5]}"
    agent_lines = [line for line in agent.log().splitlines() if REFUSAL.search(line)]
    assert not agent_lines, agent_lines[:5]
    assert "503" not in agent.log()


def test_an_idle_long_polling_agent_keeps_its_session_through_a_restart_longer_than_half_its_lease(
    tmp_path,
):
    """Review of issue 18, finding 1: the control plane is down for longer than half the session
    lease while an idle agent long-polls. The hub's keep-alive leaves nearly a full lease at
    every tick, and the agent heartbeats again as soon as a try of its wait is not answered (it
    no longer waits out the postponement while the wait retries): it keeps its session (no exit 3)."""
    lease = 24
    plane = ControlPlane(
        tmp_path, QINGLONG_HEARTBEAT_INTERVAL_SECONDS="2", QINGLONG_SESSION_LEASE_SECONDS=str(lease)
    )
    plane.start()
    agent = Agent(tmp_path / "state", tmp_path)
    try:
        worker = worker_create(name=f"long-poll-restart-{os.getpid()}")
        token = enrollment_token_create(worker_id=worker.pk).token
        assert agent.start("enroll", "--server", plane.url, "--token", token).wait(30) == 0, agent.log()
        process = agent.start(*RUN_ARGS[:-2], "--wait", "15")
        # one wait answered (the agent now postpones its heartbeat past each wait), the next held
        wait_for(lambda: "POST /api/v1/worker/claim/wait 200" in plane.log(), timeout=60, what="a wait")
        plane.stop()
        down = time.monotonic()
        while time.monotonic() - down < lease / 2 + 1:  # longer than half the lease
            assert process.poll() is None, agent.log()
            time.sleep(0.2)
        plane.start()
        wait_for(
            lambda: re.search(r"POST /api/v1/worker/(claim/wait|session/heartbeat) 200", plane.log()),
            timeout=60,
            what="the agent's calls taken after the restart",
        )
        run = enqueue(make_revision(command="echo after-restart"))
        done = wait_for(lambda: finished(run), what="a run after the restart")
        assert done.state == "succeeded"
        assert process.poll() is None, agent.log()
    finally:
        plane.stop()
        agent.kill()
    assert list(WorkerSession.objects.filter(worker=worker).values_list("generation", flat=True)) == [1]
