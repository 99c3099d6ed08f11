"""The real agent against a real ``manage.py serve`` on the test database:

* a control-plane restart — a cut shorter than the session lease — is survived with backoff and
  jitter and *without* a new session;
* after a cut longer than the lease the agent learns it is fenced, stops and exits 3, and the
  fresh process its supervisor starts registers generation 2;
* an operator-forced key rotation is carried out by the running agent;
* a revocation (``manage.py worker_admin revoke``, its own process) makes the agent kill its
  work and exit 4 at once with a message saying to re-enroll, without retrying; its started
  attempt is lost and retried per policy.

Time is moved the house way: the session lease is expired by setting the database's notion of
its expiry while the control plane is down, not by waiting it out.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from actions.credentials import credential_force_rotation
from actions.enrollment import enrollment_token_create, worker_create
from runs.models import Run, RunAttempt
from tests.agent.processes import Agent, ControlPlane, manage, wait_for
from tests.helpers import enqueue, make_revision
from workers.models import CredentialState, SessionState, Worker, WorkerCredential, WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUN_ARGS = ("run", "--poll-max", "1", "--backoff-max", "1", "--timeout", "5", "--drain-timeout", "10")


@pytest.fixture
def plane(tmp_path):
    control_plane = ControlPlane(
        tmp_path, QINGLONG_HEARTBEAT_INTERVAL_SECONDS="1", QINGLONG_SESSION_LEASE_SECONDS="20"
    )
    control_plane.start()
    yield control_plane
    control_plane.stop()


@pytest.fixture
def agent(plane, tmp_path):
    worker = worker_create(name=f"e2e-{os.getpid()}")
    token = enrollment_token_create(worker_id=worker.pk).token
    process = Agent(tmp_path / "state", tmp_path)
    assert process.start("enroll", "--server", plane.url, "--token", token).wait(30) == 0, process.log()
    yield worker, process
    process.kill()


def live_session(worker, generation: int) -> WorkerSession | None:
    return WorkerSession.objects.filter(
        worker=worker, generation=generation, state=SessionState.ONLINE
    ).first()


def finished(run) -> Run | None:
    run = Run.objects.get(pk=run.pk)
    return run if run.state in ("succeeded", "failed", "timed_out", "cancelled") else None


def test_restart_keeps_the_session_and_a_long_cut_fences_it(plane, agent):
    worker, process = agent
    process.start(*RUN_ARGS)
    first = wait_for(lambda: live_session(worker, 1), what="session generation 1")

    # a control-plane restart: connections refused for a few seconds, far less than the lease
    plane.stop()
    time.sleep(2)  # the cut the agent lives through (heartbeats every second fail meanwhile)
    plane.start()
    run = enqueue(make_revision(command="echo after-restart"))
    try:
        done = wait_for(lambda: finished(run), what="a run after the restart")
    except AssertionError as exc:  # say what the agent and the control plane saw
        raise AssertionError(
            f"{exc}\n--- agent ---\n{process.log()[-6000:]}\n--- serve ---\n{plane.log()}"
        ) from None
    assert done.state == "succeeded"
    assert RunAttempt.objects.get(run=run).session_id == first.pk  # the same session did it
    assert list(WorkerSession.objects.filter(worker=worker).values_list("generation", flat=True)) == [1]
    assert process.process.poll() is None
    assert "retrying" in process.log()  # it did notice the cut, and backed off

    # a cut longer than the session lease: the lease lapsed a minute before the control plane
    # went away (a lapse *during* an outage of the control plane itself is excused for a grace
    # window, docs/leases.md "Outages"; one from before it is not)
    plane.stop()
    WorkerSession.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=60))
    plane.start()
    assert process.process.wait(30) == 3, process.log()
    assert "session fenced (session_expired" in process.log()

    # the supervisor starts a fresh process: a new session, generation 2
    process.start(*RUN_ARGS)
    second = wait_for(lambda: live_session(worker, 2), what="session generation 2")
    assert second.pk != first.pk
    assert WorkerSession.objects.get(pk=first.pk).state in (SessionState.EXPIRED, SessionState.FENCED)
    process.process.send_signal(signal.SIGTERM)
    assert process.process.wait(30) == 0, process.log()


def test_forced_rotation_is_carried_out_and_revocation_stops_the_agent_for_good(plane, agent, tmp_path):
    worker, process = agent
    process.start(*RUN_ARGS)
    wait_for(lambda: live_session(worker, 1), what="session generation 1")
    state = tmp_path / "state" / "credential.json"
    enrolled = json.loads(state.read_text())["credentialId"]

    # the operator forces a rotation (from this process: the server hears of it via the epoch file)
    credential_force_rotation(worker_id=worker.pk, actor="alice")
    rotated = wait_for(
        lambda: (
            json.loads(state.read_text())["credentialId"] != enrolled
            and json.loads(state.read_text())["credentialId"]
        ),
        what="the agent to rotate its key",
    )
    assert WorkerCredential.objects.get(pk=rotated).state == CredentialState.ACTIVE
    assert not Worker.objects.get(pk=worker.pk).rotation_required

    # a long job under the new key, then the operator revokes the worker from the command line
    run = enqueue(make_revision(command="sleep 60", max_attempts=2, lost_retry="idempotent"))
    attempt = wait_for(
        lambda: RunAttempt.objects.filter(run=run, state="running").first(), what="the job to run"
    )
    done = manage("worker_admin", "revoke", worker.name)
    assert done.returncode == 0, done.stderr
    assert process.process.wait(20) == 4, process.log()
    log = process.log()
    # the credential check refuses it (credential_revoked) or, if this server still held the key
    # in its cache for a moment, the revoked worker's fence does (worker_revoked): both are final
    refused = re.search(r"credential refused by the control plane \((credential|worker)_revoked", log)
    assert refused, log
    refused_at = refused.start()
    assert "re-enrolled" in log[refused_at:] and "do not restart it in a loop" in log[refused_at:]
    assert "retrying" not in log[refused_at:]
    wait_for(lambda: not _alive(attempt.pid), timeout=10, what="the job's process to be killed")
    assert RunAttempt.objects.get(pk=attempt.pk).state == "lost"
    assert Run.objects.get(pk=run.pk).state == "retry_wait"

    # a restart would not help: the next process is refused at once with the same status
    assert process.start(*RUN_ARGS).wait(20) == 4


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
