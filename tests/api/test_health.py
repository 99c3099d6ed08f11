"""``/healthz`` and ``/readyz`` (api/health.py; docs/operations.md "Health").

In-process for the ready/not-ready answers, and against a real ``manage.py serve`` whose own
private PostgreSQL or Redis is stopped under it (never the shared servers of the test suite).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from actions.sweeps import run_cycle
from audit.models import SweepMark
from tests.agent.processes import ControlPlane, free_port, manage, wait_for

pytestmark = pytest.mark.django_db


def test_healthz_answers_without_touching_anything(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        answer = client.get("/healthz")
    assert (answer.status_code, answer.json()) == (200, {"status": "ok"})
    assert answer["Cache-Control"].startswith("max-age=0")


def test_readyz_is_ready_after_a_sweep_cycle_and_names_stale_sweeps(client, settings):
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json()["failing"] == ["sweeps"] and answer.json()["checks"]["database"] == "ok"
    run_cycle()
    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.json()
    assert answer.json() == {
        "status": "ready",
        "checks": {"database": "ok", "migrations": "ok", "cache": "ok", "sweeps": "ok"},
        "failing": [],
    }
    settings.QINGLONG_READY_SWEEP_MAX_AGE_SECONDS = 0
    time.sleep(0.05)
    stale = client.get("/readyz").json()
    assert stale["failing"] == ["sweeps"] and "limit 0 s" in stale["checks"]["sweeps"]
    assert SweepMark.objects.count() == 1


def test_health_endpoints_take_no_writes(client):
    assert client.post("/healthz").status_code == 405
    assert client.post("/readyz").status_code == 405


# --- real servers, private dependencies ----------------------------------------------------------


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=15) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def as_postgres(*command: str) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the ``postgres`` user then."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on its own port and directory (initdb + pg_ctl)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="qinglong-readyz-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        self.data = self.dir / "data"
        subprocess.run(
            as_postgres("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"),
            check=True,
            capture_output=True,
            timeout=120,
        )
        self.start()
        subprocess.run(
            as_postgres(
                "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "qinglong_readyz"
            ),
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/qinglong_readyz"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            as_postgres(
                "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "start"
            ),
            check=True,
            capture_output=True,
            timeout=60,
        )

    def stop(self) -> None:
        subprocess.run(
            as_postgres("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"),
            capture_output=True,
            timeout=60,
        )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


needs_postgres_tools = pytest.mark.skipif(
    shutil.which("initdb") is None or shutil.which("pg_ctl") is None, reason="initdb/pg_ctl not installed"
)


@needs_postgres_tools
@pytest.mark.sqlite  # its own PostgreSQL: once per suite run is enough
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_readyz_names_the_database_when_its_postgresql_stops(tmp_path):
    postgres = PrivatePostgres()
    plane = ControlPlane(tmp_path, DATABASE_URL=postgres.url)
    try:
        migrated = manage("migrate", "--noinput", env={"DATABASE_URL": postgres.url}, timeout=180)
        assert migrated.returncode == 0, migrated.stderr
        plane.start()
        ready = wait_for(lambda: get(plane.url + "/readyz")[0] == 200, timeout=30, what="ready")
        assert ready
        postgres.stop()
        status, body = get(plane.url + "/readyz")
        assert status == 503 and "database" in body["failing"], body
        assert body["checks"]["database"].startswith("failed: ") and postgres.url not in str(body)
        assert get(plane.url + "/healthz") == (200, {"status": "ok"})  # liveness needs no database
    finally:
        plane.stop()
        postgres.remove()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
@pytest.mark.sqlite  # the server's own Redis; its database is the SQLite test file
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_readyz_names_the_cache_when_its_redis_stops(tmp_path):
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: answers_ping(port), timeout=10, what="the private Redis")  # holds its port now
    plane = ControlPlane(tmp_path, QINGLONG_SHARED_CACHE="true", REDIS_URL=f"redis://127.0.0.1:{port}/0")
    try:
        plane.start()
        wait_for(lambda: get(plane.url + "/readyz")[0] == 200, timeout=30, what="ready")
        redis.terminate()
        redis.wait(10)
        status, body = get(plane.url + "/readyz")
        assert status == 503 and body["failing"] == ["cache"], body
        assert body["checks"]["cache"] == "failed: ConnectionError"
    finally:
        plane.stop()
        if redis.poll() is None:
            redis.kill()
            redis.wait(10)
