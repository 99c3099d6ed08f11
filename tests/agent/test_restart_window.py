"""Restarting the standalone control plane under a running agent refuses nothing (issue 16):
replay nonces live in the database (``workers.nonces``), so the new process accepts the agent's
next signed request at once — no 503, no warning line on either side — and the agent keeps its
session. Real processes: ``manage.py serve`` (Granian) on the test database and the agent.
"""

from __future__ import annotations

import os
import re

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
