"""An operator drains a worker, then its service is stopped: the agent adopts the session version
the drain moved and still drains and goes offline cleanly (exit 0)."""

from __future__ import annotations

import logging
import re
import signal
import time

import pytest

from actions.enrollment import enrollment_token_create, worker_create
from actions.workers import worker_drain
from tests.agent.processes import wait_for
from tests.agent.test_cancel_running import agent
from workers.models import WorkerSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_sigterm_right_after_an_operator_drain_still_ends_offline(live_server, tmp_path, protocol_settings):
    protocol_settings(HEARTBEAT_INTERVAL_SECONDS=20, SESSION_LEASE_SECONDS=60)  # no heartbeat in between
    worker = worker_create(name="drained-then-stopped")
    issued = enrollment_token_create(worker_id=worker.pk)
    state = tmp_path / "state"
    assert agent(state, "enroll", "--server", live_server.url, "--token", issued.token).wait(30) == 0
    process = agent(state, "run", "--poll-max", "1")
    try:
        session = wait_for(
            lambda: WorkerSession.objects.filter(worker=worker, state="online").first(), what="the session"
        )
        worker_drain(worker_id=worker.pk, actor="ops")  # version 0 -> 1 under the agent
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        session.refresh_from_db()
        assert session.state == "offline"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_shutdown_sends_no_session_call_the_server_refuses(
    live_server, tmp_path, protocol_settings, caplog
):
    """SIGTERM with heartbeats every second: no heartbeat is in flight while the drain is sent, the
    ones after it carry the version it left, and the last is answered before the offline call. No
    session call of the shutdown is refused (heartbeats used to race the drain, which one of them
    or the drain lost with a 409, and one to follow the offline call, refused as well)."""
    protocol_settings(HEARTBEAT_INTERVAL_SECONDS=1, SESSION_LEASE_SECONDS=10)
    caplog.set_level(logging.INFO, logger="qinglong.access")
    worker = worker_create(name="stopped-cleanly")
    issued = enrollment_token_create(worker_id=worker.pk)
    state = tmp_path / "state"
    assert agent(state, "enroll", "--server", live_server.url, "--token", issued.token).wait(30) == 0
    process = agent(state, "run", "--poll-max", "1")
    try:
        session = wait_for(
            lambda: WorkerSession.objects.filter(worker=worker, state="online").first(), what="the session"
        )
        time.sleep(2)  # heartbeats every second, and the agent's waiting claim is under way
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        session.refresh_from_db()
        assert session.state == "offline"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    session_calls = [
        record.getMessage()
        for record in caplog.records
        if record.name == "qinglong.access" and "/worker/session/" in record.getMessage()
    ]
    assert any("/worker/session/offline 200" in line for line in session_calls), session_calls
    refused = [line for line in session_calls if not re.search(r" 20[01] ", line)]
    assert refused == [], refused
