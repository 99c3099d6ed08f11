"""``manage.py serve``'s PostgreSQL connection pool through an outage (docs/deploy.md, "Database
connections under ASGI"; docs/leases.md, Dependency outages): a private cluster-profile control
plane (its own PostgreSQL cluster and Redis on ports of its own, one serve with one server
process), signed worker calls from this process.

While PostgreSQL is down every call answers 503 JSON ``database_unavailable`` with Retry-After,
within the pool's wait (``QINGLONG_DB_POOL_TIMEOUT_SECONDS``) and some margin, never a 500 or
a hang, and clients beating at the same time meet no 500 and no non-JSON answer; after
PostgreSQL is back a call succeeds within a few seconds (the pool's bounded reconnection); many
calls do not grow the number of PostgreSQL connections (no leak); and a serve killed with
SIGKILL leaves no connection behind (its server process dies with it).

Runs in the PostgreSQL leg only; touches neither the leg's database nor the shared Redis.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from agent.client import ApiError, Client, TransportError
from agent.state import StateDir
from protocol import wire
from tests.agent.cluster import (
    Agent,
    PrivatePostgres,
    PrivateRedis,
    Replica,
    control_plane_env,
    free_ports,
    manage,
    poll,
)
from tests.helpers import register_body

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

PORT_BASE = int(os.environ.get("QINGLONG_TEST_PORT_BASE", "8600")) + 300
POOL_TIMEOUT = 2.0
SETTINGS = {
    "QINGLONG_DB_POOL_TIMEOUT_SECONDS": str(POOL_TIMEOUT),
    "QINGLONG_ACCESS_LOG_LEVEL": "WARNING",
    "QINGLONG_RATE_WORKER": "100000/m",  # the calls here are many, not the point
}


def backends(pg: PrivatePostgres) -> int:
    """Client connections to the control plane's database, not counting this query's own."""
    return pg.query(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = 'qinglong' AND backend_type = 'client backend'"
        " AND pid <> pg_backend_pid()"
    )[0][0]


class Heartbeats:
    """Signed heartbeats of one session; each call returns (seconds taken, status, code, Retry-After)."""

    def __init__(self, client: Client, session: dict) -> None:
        self.client = client
        self.fence = {
            "sessionId": session["sessionId"],
            "generation": session["generation"],
        }
        self.version = session["version"]

    def beat(self) -> tuple[float, int, str, float | None]:
        began = time.monotonic()
        try:
            answer = self.client.post(
                wire.SESSION_HEARTBEAT, {**self.fence, "expectedVersion": self.version, "availableSlots": 2}
            )
        except ApiError as error:
            return time.monotonic() - began, error.status, error.code, error.retry_after
        except TransportError as error:
            return time.monotonic() - began, 0, f"transport: {error}", None
        self.version = answer["version"]
        return time.monotonic() - began, 200, "", None


def test_serve_answers_a_postgres_outage_with_503_and_recovers_without_leaking_connections(tmp_path: Path):
    pg_port, redis_port, port = free_ports(PORT_BASE, PORT_BASE + 99, 3)
    pg = PrivatePostgres(tmp_path, pg_port)
    redis = PrivateRedis(tmp_path, redis_port)
    replica: Replica | None = None
    try:
        pg.start()
        pg.create_database()
        redis.start()
        env = control_plane_env(pg, redis.url, tmp_path / "var", **SETTINGS)
        manage(env, "migrate", "--no-input")
        replica = Replica(tmp_path, port, env, "a")
        replica.start()
        agent = Agent(tmp_path, "pool-probe")
        agent.enroll(env, replica.url)
        credential, key = StateDir(agent.state).load()
        client = Client(replica.url, key_id=credential.credentialId, key=key, timeout=30)
        session = client.post(wire.SESSION_REGISTER, register_body())
        beats = Heartbeats(client, session)

        warm = [beats.beat() for _ in range(50)]
        assert all(status == 200 for _, status, _, _ in warm), warm[:3]
        settled = backends(pg)
        more = [beats.beat() for _ in range(300)]
        assert all(status == 200 for _, status, _, _ in more), [m for m in more if m[1] != 200][:3]
        after_many = backends(pg)

        # Three more clients beat the same session meanwhile (their versions go stale: 409s are
        # fine); none of them may meet a 500 or a non-JSON answer across the restart.
        others = [
            Heartbeats(Client(replica.url, key_id=credential.credentialId, key=key, timeout=30), session)
        ]
        others += [
            Heartbeats(Client(replica.url, key_id=credential.credentialId, key=key, timeout=30), session)
        ]
        others += [
            Heartbeats(Client(replica.url, key_id=credential.credentialId, key=key, timeout=30), session)
        ]
        loud: list[tuple[float, int, str, float | None]] = []
        done = threading.Event()

        def hammer(beater: Heartbeats) -> None:
            while not done.is_set():
                loud.append(beater.beat())

        hammers = [threading.Thread(target=hammer, args=(o,), daemon=True) for o in others]
        for thread in hammers:
            thread.start()
        pg.stop("fast")
        during: list[tuple[float, int, str, float | None]] = []
        stopped = time.monotonic()
        while time.monotonic() - stopped < 8:
            during.append(beats.beat())
        pg.start()
        back = time.monotonic()
        recovered: tuple[float, int, str, float | None] = (0.0, 0, "", None)
        while time.monotonic() - back < 30:
            recovered = beats.beat()
            if recovered[1] == 200:
                break
            time.sleep(0.1)
        recovery_seconds = time.monotonic() - back
        done.set()
        for thread in hammers:
            thread.join(40)
        after_outage = [beats.beat() for _ in range(300)]
        after_recovery = backends(pg)
        logs = replica.logs()
        replica.kill()  # SIGKILL: serve's server process dies with it, and so do its connections
        replica = None
        try:
            poll(lambda: backends(pg) == 0, 10, "the killed serve's connections to close")
            left_after_kill = 0
        except AssertionError:
            left_after_kill = backends(pg)
    finally:
        if replica is not None:
            replica.stop()
        redis.stop()
        pg.close()

    assert after_many <= settled + 1, f"{settled} connections after 50 calls, {after_many} after 300 more"
    assert during, "no call was made during the outage"
    wrong = [d for d in during if d[1] != 503 or d[2] != "database_unavailable" or not d[3]]
    assert not wrong, (
        f"{len(wrong)} of {len(during)} outage answers were not 503 database_unavailable: {wrong[:5]}"
    )
    slow = [d for d in during if d[0] > POOL_TIMEOUT + 3]
    assert not slow, f"outage answers took up to {max(d[0] for d in during):.1f} s: {slow[:3]}"
    assert recovered[1] == 200, f"no call succeeded within 30 s of PostgreSQL's return: {recovered}"
    assert recovery_seconds < 6, (
        f"the first call succeeded {recovery_seconds:.1f} s after PostgreSQL's return"
    )
    assert all(status == 200 for _, status, _, _ in after_outage), [a for a in after_outage if a[1] != 200][
        :3
    ]
    # The three clients of the restart may have grown the pool by one connection each.
    assert after_recovery <= after_many + len(others), (
        f"{after_many} connections before the outage, {after_recovery} after it and 300 more calls"
    )
    assert not [b for b in loud if b[1] == 500 or b[1] == 0], [b for b in loud if b[1] in (0, 500)][:5]
    assert {b[1] for b in loud} <= {200, 409, 503}, {(b[1], b[2]) for b in loud}
    assert left_after_kill == 0, f"{left_after_kill} connections outlived a serve killed with SIGKILL"
    assert "Traceback" not in logs, logs[logs.index("Traceback") - 500 :][:3000]
