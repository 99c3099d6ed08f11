"""The real agent process against a live control plane: real jobs, restart, fencing, shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from actions.enrollment import enrollment_token_create, worker_create
from agent.state import StateDir
from protocol import wire
from runs.models import Run
from tests.agent.processes import wait_for
from tests.helpers import Enrolled, SignedClient, enqueue, make_revision
from workers.models import WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def agent(state: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "QINGLONG_WORKER_LOG_LEVEL": "INFO"}
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "--state-dir", str(state), *args], cwd=ROOT, env=env, **popen
    )


@pytest.fixture
def enrolled_agent(live_server, tmp_path):
    worker = worker_create(name="e2e-worker")
    issued = enrollment_token_create(worker_id=worker.pk)
    state = tmp_path / "state"
    done = agent(
        state, "enroll", "--server", live_server.url, "--token", issued.token, "--worker", "e2e-worker"
    )
    assert done.wait(30) == 0
    assert (state / "credential.json").stat().st_mode & 0o777 == 0o600
    return worker, state


def test_agent_runs_real_jobs_restarts_as_generation_2_and_drains(enrolled_agent, client):
    worker, state = enrolled_agent
    samples = {
        "shell": (make_revision(command="echo hello-shell"), "succeeded", 0),
        "python": (make_revision(executor="python", command="print('hello', 6 * 7)"), "succeeded", 0),
        "exit-3": (make_revision(command="exit 3"), "failed", 3),
        "timeout": (make_revision(command="sleep 30", timeout_seconds=2), "timed_out", None),
    }
    runs = {name: enqueue(revision) for name, (revision, _, _) in samples.items()}
    process = agent(state, "run", "--max-concurrent", "4", "--poll-max", "1", "--drain-timeout", "10")
    try:

        def all_done():
            states = dict(Run.objects.filter(pk__in=[r.pk for r in runs.values()]).values_list("pk", "state"))
            return all(s in ("succeeded", "failed", "timed_out", "cancelled") for s in states.values())

        wait_for(all_done, what="the four sample runs")
        for name, (_, state_expected, exit_code) in samples.items():
            run = Run.objects.get(pk=runs[name].pk)
            assert run.state == state_expected, (name, run.state)
            if exit_code is not None:
                assert run.exit_code == exit_code, name
        assert "hello 42" in Run.objects.get(pk=runs["python"].pk).attempts.get().stdout_tail

        first = WorkerSession.objects.get(worker=worker, generation=1)
        process.send_signal(signal.SIGKILL)  # a crash: no drain, no offline
        process.wait(10)
        process = agent(state, "run", "--poll-max", "1", "--drain-timeout", "10")
        second = wait_for(
            lambda: WorkerSession.objects.filter(worker=worker, generation=2).first(), what="generation 2"
        )
        assert second.state == "online"
        first.refresh_from_db()
        assert first.state == "fenced"

        credential, agent_key = StateDir(state).load()  # the agent's own key file, read back
        key = load_pem_private_key(agent_key.to_pem(), password=None)
        api = SignedClient(client, Enrolled(worker.pk, worker.name, credential.credentialId, key))
        before = list(WorkerSession.objects.order_by("pk").values())
        answer = api.post(
            wire.SESSION_HEARTBEAT,
            {
                "sessionId": str(first.pk),
                "generation": 1,
                "expectedVersion": first.version,
                "availableSlots": 1,
            },
        )
        assert answer.status_code == 409 and answer.json()["code"] == "session_superseded"
        assert list(WorkerSession.objects.order_by("pk").values()) == before

        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        second.refresh_from_db()
        assert second.state == "offline"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_busy_agent_goes_from_one_attempt_to_the_next_with_its_completions(enrolled_agent, tmp_path):
    """docs/leases.md, "The next claim": with one slot and a backlog, every attempt after the first
    is claimed by the completion of the one before it, and every run succeeds once."""
    _, state = enrolled_agent
    revision = make_revision(command="echo chained")
    runs = [enqueue(revision) for _ in range(4)]
    log_path = tmp_path / "agent.log"
    with log_path.open("wb") as log_file:
        process = agent(state, "run", "--max-concurrent", "1", "--drain-timeout", "10", stderr=log_file)
    try:

        def all_succeeded():
            return Run.objects.filter(pk__in=[r.pk for r in runs], state="succeeded").count() == len(runs)

        wait_for(all_succeeded, what="the four runs")
        assert {run.attempts.count() for run in Run.objects.filter(pk__in=[r.pk for r in runs])} == {1}
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    chained = log_path.read_text().count("a completion's next claim started 1 attempt(s)")
    assert chained == len(runs) - 1, log_path.read_text()[-3000:]
