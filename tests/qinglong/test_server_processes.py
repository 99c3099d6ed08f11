"""``manage.py serve``'s server processes: they die with serve, and on PostgreSQL they keep their
database connections in a pool instead of opening one per request (docs/deploy.md, "Database
connections under ASGI").

Real processes: serve is started, killed with SIGKILL and watched through ``/proc``; the
connections are counted by PostgreSQL itself (``pg_stat_database.sessions``, every session ever
opened on the test database).
"""

from __future__ import annotations

import os
import signal
import socket

import psutil
import pytest
from django.db import connection

from agent.client import Client
from protocol import wire
from tests.agent.processes import ControlPlane, wait_for
from tests.agent.unit.test_guard import alive
from tests.helpers import enrolled_worker, register

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def children_of(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes.

    psutil finds them by parent pid; reading ``/proc/<pid>/task/*/children`` raced a serve thread
    ending between the listing and the read (found by CI).
    """
    return [child.pid for child in psutil.Process(pid).children()]


def test_a_serve_killed_with_sigkill_takes_its_server_processes_with_it(tmp_path):
    plane = ControlPlane(tmp_path, QINGLONG_ACCESS_LOG_LEVEL="WARNING")
    plane.start()
    servers = children_of(plane.process.pid)
    try:
        assert servers, "serve has no server process"
        plane.process.kill()  # SIGKILL: serve cannot stop them itself
        plane.process.wait(10)
        wait_for(lambda: not any(map(alive, servers)), timeout=10, what="the server processes to end")
        with socket.socket() as probe:  # nobody serves the port any more
            assert probe.connect_ex(("127.0.0.1", plane.port)) != 0
    finally:
        for pid in servers:  # never leave an orphaned server behind, even on failure
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        plane.stop()


def sessions_opened() -> int:
    """Sessions PostgreSQL has opened on the test database so far (pg_stat_database, PG ≥ 14)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


@pytest.mark.postgres
def test_server_processes_serve_requests_from_a_connection_pool(tmp_path):
    plane = ControlPlane(tmp_path, QINGLONG_ACCESS_LOG_LEVEL="WARNING", QINGLONG_DB_POOL_MAX_SIZE="6")
    plane.start()
    try:
        worker = enrolled_worker()
        session = register(worker)
        client = Client(plane.url, key_id=worker.credential_id, key=worker.key, timeout=10)
        version = session.version
        answer = client.post(
            wire.SESSION_HEARTBEAT, {**session.fence(), "expectedVersion": version, "availableSlots": 1}
        )
        before = sessions_opened()
        for _ in range(40):
            version = answer["version"]
            answer = client.post(
                wire.SESSION_HEARTBEAT, {**session.fence(), "expectedVersion": version, "availableSlots": 1}
            )
        opened = sessions_opened() - before
        # Without the pool each of the 40 requests opens a session of its own; the pool may still
        # be filling up to its minimum, and serve's own threads reconnect at most once a minute.
        assert opened <= 6, f"{opened} database sessions opened for 40 requests"
    finally:
        plane.stop()
