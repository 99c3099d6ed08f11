"""SIGTERM lands while a claim's answer is in flight (agent/claims.py; docs/leases.md, "The next
claim"): a real agent against the live server.

What was claimed is released at once, not started, and the agent goes offline cleanly (exit 0) —
through the short claim, through the waiting claim (whose answer SIGTERM cut off: learnt again by
replaying its offers once draining), and when the control plane does not answer the release (the
attempt is started instead, as work leased before a drain). The claim holds its answer until the
test has sent SIGTERM, and a second more for the agent's handler to run."""

from __future__ import annotations

import signal
import threading
import time

import pytest

import api.leases.views as views
import api.leases.waiting as waiting
from actions.enrollment import enrollment_token_create, worker_create
from core.errors import DomainError
from leases.models import RunDispatchLease
from runs.models import RunAttempt
from tests.agent.processes import wait_for
from tests.agent.test_cancel_running import agent
from tests.helpers import enqueue, make_revision
from workers.models import WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: How long a claim's answer is still held once SIGTERM was sent: for the agent's handler to run.
AFTER_SIGNAL_SECONDS = 1.0


class Claiming:
    """The claim has claimed (``claimed``); the test has sent SIGTERM (``signalled``)."""

    def __init__(self) -> None:
        self.claimed = threading.Event()
        self.signalled = threading.Event()

    def held(self, module):
        """``module.lease_claim``, holding its answer once it claimed something until SIGTERM was
        sent (and a moment more)."""
        original = module.lease_claim

        def claim(**kwargs):
            offers = original(**kwargs)
            if offers:
                self.claimed.set()
                self.signalled.wait(60)
                time.sleep(AFTER_SIGNAL_SECONDS)
            return offers

        return claim


def stop_while_claiming(live_server, tmp_path, name: str, claiming: Claiming, *args: str):
    """Enroll and run an agent, enqueue one run, SIGTERM it once the claim claimed; returns
    (exit code, run, session)."""
    worker = worker_create(name=name)
    issued = enrollment_token_create(worker_id=worker.pk)
    state = tmp_path / "state"
    assert agent(state, "enroll", "--server", live_server.url, "--token", issued.token).wait(30) == 0
    process = agent(state, "run", "--poll-max", "0.5", *args)
    try:
        session = wait_for(
            lambda: WorkerSession.objects.filter(worker=worker, state="online").first(), what="the session"
        )
        run = enqueue(make_revision(command="echo hi"))
        assert claiming.claimed.wait(30)
        process.send_signal(signal.SIGTERM)
        claiming.signalled.set()
        code = process.wait(90)
    finally:
        claiming.signalled.set()
        if process.poll() is None:
            process.kill()
            process.wait()
    session.refresh_from_db()
    return code, run, session


@pytest.fixture
def short_leases(protocol_settings):
    protocol_settings(HEARTBEAT_INTERVAL_SECONDS=2, SESSION_LEASE_SECONDS=20, DISPATCH_TIMEOUT_SECONDS=30)


@pytest.mark.usefixtures("short_leases")
def test_what_a_short_claim_answered_after_sigterm_is_released(live_server, tmp_path, monkeypatch):
    claiming = Claiming()
    monkeypatch.setattr(views, "lease_claim", claiming.held(views))
    code, run, session = stop_while_claiming(live_server, tmp_path, "short", claiming, "--no-long-poll")
    lease = RunDispatchLease.objects.get(attempt__run=run)
    assert (code, session.state) == (0, "offline")
    assert (lease.state, lease.release_reason) == ("released", "worker_release")
    assert RunAttempt.objects.get(run=run).state == "claimed"  # back in the queue, never started


@pytest.mark.usefixtures("short_leases")
def test_what_a_cut_short_waiting_claim_claimed_is_learnt_and_released(live_server, tmp_path, monkeypatch):
    claiming = Claiming()
    monkeypatch.setattr(waiting, "lease_claim", claiming.held(waiting))
    code, run, session = stop_while_claiming(live_server, tmp_path, "waiting", claiming)
    lease = RunDispatchLease.objects.get(attempt__run=run)
    assert (code, session.state) == (0, "offline")  # it was exit 5: session_has_active_leases
    assert (lease.state, lease.release_reason) == ("released", "worker_release")


@pytest.mark.usefixtures("short_leases")
def test_a_release_not_answered_runs_the_attempt_instead(live_server, tmp_path, monkeypatch):
    """The control plane answers every release 503 (its database busy): the agent gives up after
    5 s and starts the attempt, as work leased before a drain, instead of leaving the lease to
    lapse — which kept the session from going offline (``session_has_active_leases``, exit 5)."""

    def busy(**kwargs):
        raise DomainError("storage_busy", "the database is busy; retry", retry_after=1)

    claiming = Claiming()
    monkeypatch.setattr(views, "lease_release", busy)
    monkeypatch.setattr(views, "lease_claim", claiming.held(views))
    code, run, session = stop_while_claiming(live_server, tmp_path, "busy", claiming, "--no-long-poll")
    assert (code, session.state) == (0, "offline")
    assert RunAttempt.objects.get(run=run).state == "succeeded"
