"""The server processes' pool checks a connection without a round trip (``qinglong.pgpool``;
issue 13: "no per-request health-check query") and still never hands out one PostgreSQL dropped.

Real connections to the shared server: an idle healthy connection passes and the server sees no
statement (``pg_stat_activity.query`` still shows the last one it ran); one whose backend was
terminated fails the check; a psycopg_pool pool with this check replaces a terminated connection
and the next checkout works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from qinglong.pgpool import check_idle_connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

ROOT = Path(__file__).resolve().parents[2]


def _conninfo() -> str:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool", "options"):
        params.pop(key, None)
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if v is not None})


@pytest.fixture
def observer():
    with psycopg.connect(_conninfo(), autocommit=True) as conn:
        yield conn


def _last_query(observer, pid: int) -> str:
    return observer.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]


def test_a_healthy_idle_connection_passes_and_the_server_sees_no_statement(observer):
    with psycopg.connect(_conninfo(), autocommit=True) as conn:
        conn.execute("SELECT 'the last statement'")
        for _ in range(3):
            check_idle_connection(conn)
        assert _last_query(observer, conn.info.backend_pid) == "SELECT 'the last statement'"
        ConnectionPool.check_connection(conn)  # psycopg_pool's own check: a statement each time
        assert _last_query(observer, conn.info.backend_pid) == ""


def test_a_connection_whose_backend_was_terminated_fails_the_check(observer):
    with psycopg.connect(_conninfo(), autocommit=True) as conn:
        observer.execute("SELECT pg_terminate_backend(%s, 5000)", [conn.info.backend_pid])
        with pytest.raises(psycopg.OperationalError):
            check_idle_connection(conn)


SERVER_PROCESS = """
import json, django, psycopg, sys
django.setup()
from django.db import connection
def backend():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    connection.close()  # the request ends: the connection goes back to the pool
    return pid
first = backend()
with psycopg.connect(sys.argv[1], autocommit=True) as observer:
    observer.execute("SELECT pg_terminate_backend(%s, 5000)", [first])
    observer.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                     " WHERE application_name = 'qinglong-pool-probe' AND pid <> pg_backend_pid()")
after = [backend() for _ in range(4)]
print(json.dumps({"engine": connection.settings_dict["ENGINE"], "first": first, "after": after}))
"""


def test_a_server_process_never_hands_a_request_a_connection_postgresql_closed():
    """A server process's settings (``QINGLONG_SERVE_DB_POOL``), in a fresh process: every pooled
    connection is terminated between two requests, and the next requests get working ones."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_", "PYTEST"))}
    url = connection.settings_dict
    env.update(
        DJANGO_SETTINGS_MODULE="qinglong.settings",
        DATABASE_URL=f"postgres://{url['USER']}@{url['HOST']}:{url['PORT']}/{url['NAME']}",
        QINGLONG_SERVE_DB_POOL="1",
        PGAPPNAME="qinglong-pool-probe",
    )
    done = subprocess.run(
        [sys.executable, "-c", SERVER_PROCESS, _conninfo()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["engine"] == "qinglong.postgresql"
    assert seen["first"] not in seen["after"] and all(seen["after"]), seen
