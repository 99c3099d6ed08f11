"""Waiting claims end to end (issue 18; docs/leases.md "Waiting claims"): real ``manage.py serve``
processes (Granian, the async waiting view) and a real agent holding a long poll.

The wake-up must be what delivers the work: the servers' slow re-check is set far beyond the
deadline and the agent's wait is long (the session lease is long too), so neither a re-check nor
the next wait's first claim can start the run in time — only the commit's wake-up can (on SQLite
the in-process notification of the one server process, on PostgreSQL ``LISTEN/NOTIFY``, across
two replicas).
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from django.db import connection

from actions.enrollment import enrollment_token_create, worker_create
from leases.models import RunDispatchLease
from tests.agent.processes import Agent, ControlPlane, wait_for
from tests.helpers import enrolled_worker, make_revision, operator_headers, register
from tests.leases.test_waiting_claims import wait_request

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: A wait (and session lease) long enough that no new wait starts during the test's window.
SERVER_SETTINGS = {
    "QINGLONG_SESSION_LEASE_SECONDS": "150",
    "QINGLONG_HEARTBEAT_INTERVAL_SECONDS": "60",
    "QINGLONG_CLAIM_WAIT_MAX_SECONDS": "45",
    "QINGLONG_CLAIM_WAIT_RECHECK_SECONDS": "600",
}
#: Far below the wait (45 s) and the re-check (600 s); far above the push's milliseconds, for a
#: loaded machine.
PUSH_DEADLINE_SECONDS = 8.0


def waiting_claims(server: ControlPlane) -> float:
    """The server's ``qinglong_waiting_claims`` gauge."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("qinglong_waiting_claims "):
                return float(line.split()[1])
    return 0.0


def post(server: ControlPlane, path: str, body: dict, headers: dict[str, str]) -> dict:
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=15) as answer:
        return json.loads(answer.read())


def start_agent(tmp_path: Path, server: ControlPlane) -> Agent:
    worker = worker_create(name=f"waiting-{tmp_path.name[-8:]}".replace("_", "-"))
    issued = enrollment_token_create(worker_id=worker.pk)
    agent = Agent(tmp_path / "state", tmp_path)
    enrolled = agent.start("enroll", "--server", server.url, "--token", issued.token, "--worker", worker.name)
    assert enrolled.wait(30) == 0, agent.log()
    agent.start("run", "--server", server.url, "--wait", "45", "--work-dir", str(tmp_path / "work"))
    return agent


def enqueue_and_time_start(through: ControlPlane, waiting_on: ControlPlane) -> float:
    """Enqueue a run through ``through``'s operator API once the agent waits on ``waiting_on``;
    return the seconds from the request to the starting ACK."""
    wait_for(lambda: waiting_claims(waiting_on) >= 1, timeout=60, what="the agent's waiting claim")
    revision = make_revision(command="true")
    headers = operator_headers("ops-push")
    sent = time.time()
    run = post(through, "/api/v1/ops/runs", {"revisionId": str(revision.pk)}, headers)
    lease = wait_for(
        lambda: RunDispatchLease.objects.filter(run_id=run["id"], starting_at__isnull=False).first(),
        timeout=PUSH_DEADLINE_SECONDS,
        what="the starting ACK of the enqueued run",
        step=0.02,
    )
    return lease.starting_at.timestamp() - sent


def test_a_run_enqueued_through_the_api_wakes_the_waiting_agent_at_once(tmp_path):
    server = ControlPlane(tmp_path, **SERVER_SETTINGS)
    server.start()
    agent = start_agent(tmp_path, server)
    try:
        latency = enqueue_and_time_start(server, server)
        assert latency < PUSH_DEADLINE_SECONDS
    finally:
        agent.kill()
        server.stop()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="replicas share a PostgreSQL database")
def test_a_run_enqueued_through_one_replica_wakes_an_agent_waiting_on_the_other(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    replica_a = ControlPlane(tmp_path / "a", **SERVER_SETTINGS)
    replica_b = ControlPlane(tmp_path / "b", **SERVER_SETTINGS)
    replica_a.start()
    replica_b.start()
    agent = start_agent(tmp_path, replica_b)
    try:
        latency = enqueue_and_time_start(replica_a, replica_b)
        assert latency < PUSH_DEADLINE_SECONDS
    finally:
        agent.kill()
        replica_a.stop()
        replica_b.stop()


def test_a_server_shutting_down_ends_its_waiting_claims_at_once(tmp_path):
    server = ControlPlane(tmp_path, **SERVER_SETTINGS)
    server.start()
    session = register(enrolled_worker())
    answers: list[tuple[int, dict]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(wait_request(server.url, session, wait=45)), daemon=True
    )
    try:
        waiting.start()
        wait_for(lambda: waiting_claims(server) >= 1, timeout=60, what="the waiting claim")
        asked = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        waiting.join(PUSH_DEADLINE_SECONDS)
        assert answers, f"no answer {time.monotonic() - asked:.1f} s after SIGTERM: {server.log()}"
        status, body = answers[0]
        assert status == 200 and body["ended"] == "shutdown", body
        assert server.process.wait(30) == 0
    finally:
        server.stop()


def test_a_run_reaches_two_idle_waiting_workers_at_once_whichever_waited_first(tmp_path):
    """Two idle workers of the same capabilities both hold a waiting claim; the worse-ranked one
    (higher worker id, placement.ranking) began its wait first. A run enqueued through the API must
    be claimed by one of them within the push deadline, not after the dispatch hold."""
    server = ControlPlane(tmp_path, **SERVER_SETTINGS, QINGLONG_DISPATCH_HOLD_SECONDS="30")
    server.start()
    better = register(enrolled_worker())
    worse = register(enrolled_worker())
    assert str(better.worker.worker_id) < str(worse.worker.worker_id)  # rank: worker id ascending
    answers: list[tuple[int, dict]] = []
    threads = []
    try:
        for count, session in enumerate((worse, better), start=1):
            thread = threading.Thread(
                target=lambda session=session: answers.append(wait_request(server.url, session, wait=45)),
                daemon=True,
            )
            thread.start()
            threads.append(thread)
            wait_for(
                lambda count=count: waiting_claims(server) >= count, timeout=60, what="the waiting claims"
            )
        revision = make_revision(command="true")
        run = post(server, "/api/v1/ops/runs", {"revisionId": str(revision.pk)}, operator_headers("ops-two"))
        wait_for(
            lambda: RunDispatchLease.objects.filter(run_id=run["id"]).exists(),
            timeout=PUSH_DEADLINE_SECONDS,
            what="a claim of the run by either waiting worker",
            step=0.02,
        )
    finally:
        server.stop()  # ends both waits (shutdown)
        for thread in threads:
            thread.join(10)
