"""The server processes' connection pool holds one connection for each request slot and each
waiting-claim thread (docs/deploy.md, "Threads and database connections": "each request slot and
each waiting-claim thread holds at most one while it works: 8 + 8 by default").

Both thread counts follow ``QINGLONG_MAX_ACTIVE_REQUESTS`` (``manage.py serve --threads``), the
pool's size does not: with ``--threads 16`` a process has 32 holders for 20 connections, and a
request that got its slot then waits ``QINGLONG_DB_POOL_TIMEOUT_SECONDS`` and answers 503
``database_unavailable`` ("cannot reach its database") while the database is fine — another
worker's heartbeat included, as the real-process test below shows with ``--threads 24`` and one
worker's claims waiting on its locked row. Either the pool follows the slots or a system check
refuses the combination. The settings are read in a fresh process, as a server process of serve
reads them (``QINGLONG_SERVE_DB_POOL`` set).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.client import ApiError, Client
from protocol import wire
from tests.agent.processes import ControlPlane, wait_for
from tests.concurrency.threads import LockHolder
from tests.helpers import OfferTicket, enrolled_worker, heartbeat, register

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, django
django.setup()
from django.conf import settings
from django.core import checks
pool = settings.DATABASES["default"]["OPTIONS"].get("pool") or {}
errors = [m.id for m in checks.run_checks() if m.level >= checks.ERROR and m.id.startswith("qinglong.")]
print(json.dumps({"max_size": pool.get("max_size"), "slots": settings.QINGLONG_SERVER["MAX_ACTIVE_REQUESTS"],
                  "errors": errors}))
"""


def probe(threads: int, **extra: str) -> dict:
    """The pool size, the request slots and the qinglong.* check errors of a server process's
    settings with ``threads`` slots (and ``extra`` environment)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_", "PYTEST"))}
    env.update(
        DJANGO_SETTINGS_MODULE="qinglong.settings",
        DATABASE_URL="postgres://postgres@127.0.0.1:9/unused",  # never connected: settings only
        QINGLONG_SERVE_DB_POOL="1",
        QINGLONG_MAX_ACTIVE_REQUESTS=str(threads),
        **extra,
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_pool_set_smaller_than_its_threads_is_refused_by_a_system_check():
    assert probe(8, QINGLONG_DB_POOL_MAX_SIZE="15")["errors"] == ["qinglong.E005"]
    assert probe(8, QINGLONG_DB_POOL_MAX_SIZE="16")["errors"] == []


@pytest.mark.parametrize("threads", [8, 16, 24])
def test_the_pool_has_a_connection_for_every_slot_and_waiting_thread_or_serve_is_refused(threads):
    facts = probe(threads)
    holders = 2 * facts["slots"]  # the request slots + api.waiting's EXECUTOR threads
    assert facts["max_size"] >= holders or facts["errors"], (
        f"{holders} connection holders per process, a pool of {facts['max_size']}, and no check refuses it"
    )


class WideControlPlane(ControlPlane):
    """``manage.py serve --threads 24`` on the test database (ControlPlane's serve has 4)."""

    def _start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"serve-{self.starts}.log", "wb")  # noqa: SIM115 - closed with the process
        command = [
            sys.executable,
            str(ROOT / "manage.py"),
            "serve",
            "--port",
            str(self.port),
            "--threads",
            "24",
        ]
        self.process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._answers, timeout=30, what=f"the control plane on {self.url}")


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.postgres
def test_a_worker_waiting_on_its_row_lock_does_not_make_another_workers_heartbeat_database_unavailable(
    tmp_path,
):
    """24 claims of one worker wait for its row (held here; each holds a request slot and, once
    it runs, a pooled connection, up to the 5 s lock timeout); meanwhile another worker heartbeats.
    The database is up throughout: no answer may say it cannot be reached."""
    plane = WideControlPlane(tmp_path, QINGLONG_ACCESS_LOG_LEVEL="WARNING", QINGLONG_RATE_WORKER="100000/m")
    plane.start()
    holder: LockHolder | None = None
    try:
        busy, other = enrolled_worker(), enrolled_worker()
        busy_session, other_session = register(busy), register(other)
        holder = LockHolder(busy.worker_id)
        holder.start()
        assert holder.locked.wait(10)
        answers: list[tuple[str, int, str]] = []

        def call(who, path: str, body: dict, label: str) -> None:
            client = Client(plane.url, key_id=who.credential_id, key=who.key, timeout=30)
            try:
                client.post(path, body)
                answers.append((label, 200, ""))
            except ApiError as error:
                answers.append((label, error.status, error.code))

        def claim() -> None:
            ticket = OfferTicket()
            offers = [{"offerId": str(ticket.offer_id), "leaseToken": ticket.token}]
            body = {**busy_session.fence(), "workerId": str(busy.worker_id), "offers": offers}
            call(busy, wire.CLAIM, body, "claim")

        claims = [threading.Thread(target=claim, daemon=True) for _ in range(24)]
        for thread in claims:
            thread.start()
        time.sleep(1.0)  # the claims hold their slots and connections now
        call(other, wire.SESSION_HEARTBEAT, heartbeat(other_session), "other worker's heartbeat")
        for thread in claims:
            thread.join(30)
    finally:
        if holder is not None:
            holder.release.set()
            holder.join(10)
        plane.stop()
    unreachable = [answer for answer in answers if answer[2] == "database_unavailable"]
    assert not unreachable, f"{len(unreachable)} answers said the database was unreachable: {unreachable[:5]}"
