"""Acceptance (d) of docs/leases.md, Dependency outages: the cluster profile with two replicas on a
private PostgreSQL cluster and a private Redis (ports 17200-17299, started and stopped here), real
agents running jobs through the faults. Redis is stopped for twice the heartbeat interval, then
PostgreSQL is restarted → no HTML 500 on any probe, no traceback in the replicas' logs, no session
expired, no run lost, every run succeeded once.

Runs in the PostgreSQL leg only (the cluster profile is PostgreSQL + Redis), but touches neither
the leg's database nor the shared Redis.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests.agent.cluster import (
    Agent,
    PrivatePostgres,
    PrivateRedis,
    Replica,
    control_plane_env,
    create_task,
    free_ports,
    invariants,
    manage,
    poll,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

HEARTBEAT = 4
TIMINGS = {
    "QINGLONG_SESSION_LEASE_SECONDS": "12",
    "QINGLONG_HEARTBEAT_INTERVAL_SECONDS": str(HEARTBEAT),
    "QINGLONG_RUN_LEASE_SECONDS": "12",
    "QINGLONG_OUTAGE_GRACE_SECONDS": "15",
    "QINGLONG_LIVENESS_BEAT_SECONDS": "1",
    "QINGLONG_OUTAGE_AFTER_SECONDS": "3",
    "QINGLONG_LOST_AFTER_SECONDS": "60",
    "QINGLONG_DISPATCH_HOLD_SECONDS": "0",
}


def probe(
    url: str, *, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, str, str, str]:
    """(status, content type, body head, Retry-After) of one request."""
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None)
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read(200).decode(), ""
    except urllib.error.HTTPError as exc:
        return (
            exc.code,
            exc.headers.get("Content-Type", ""),
            exc.read(200).decode(),
            exc.headers.get("Retry-After", ""),
        )


#: Requests that need the database or the cache before any view runs: a worker call (signature,
#: nonce, rate limit), an operator token (looked up in the database), an admin session cookie
#: (loaded by the session middleware, before DRF's exception handler could see a failure).
PROBES = (
    ("/api/v1/worker/session/heartbeat", "POST", {}),
    ("/api/v1/ops/runs", "GET", {"Authorization": "Token " + "0" * 40}),
    ("/admin/", "GET", {"Cookie": "sessionid=" + "x" * 32}),
)


def probe_all(replicas: list[Replica], seen: list[tuple[str, int, str, str, str]]) -> None:
    for replica in replicas:
        for path, method, headers in PROBES:
            status, kind, body, retry_after = probe(replica.url + path, method=method, headers=headers)
            seen.append((path, status, kind, body, retry_after))


def test_redis_stopped_and_postgres_restarted_under_two_replicas_lose_nothing(tmp_path):
    pg_port, redis_port, port_a, port_b = free_ports(17200, 17299, 4)
    pg = PrivatePostgres(tmp_path, pg_port)
    redis = PrivateRedis(tmp_path, redis_port)
    replicas: list[Replica] = []
    agents: list[Agent] = []
    try:
        pg.start()
        pg.create_database()
        redis.start()
        env = control_plane_env(pg, redis.url, tmp_path / "var", **TIMINGS)
        manage(env, "migrate", "--no-input")
        replicas = [Replica(tmp_path, port_a, env, "a"), Replica(tmp_path, port_b, env, "b")]
        for replica in replicas:
            replica.start()
        agents = [Agent(tmp_path, "agent-a"), Agent(tmp_path, "agent-b")]
        for agent, replica in zip(agents, replicas, strict=True):
            agent.enroll(env, replica.url)
            agent.start("--max-concurrent", "2")
        create_task(env, "through-faults", "sleep 45; echo done", runs=4)
        poll(
            lambda: pg.query("SELECT count(*) FROM runs_runattempt WHERE state = 'running'")[0][0] == 4,
            60,
            "four running attempts",
        )
        seen: list[tuple[str, int, str, str, str]] = []
        redis.stop()
        stopped = time.monotonic()
        while time.monotonic() - stopped < 2 * HEARTBEAT:
            probe_all(replicas, seen)
            time.sleep(0.5)
        redis.start()
        time.sleep(HEARTBEAT)
        pg.stop("fast")
        time.sleep(1)
        probe_all(replicas, seen)  # while PostgreSQL is down
        pg.start()
        probe_all(replicas, seen)
        poll(
            lambda: (
                pg.query("SELECT count(*) FROM runs_run WHERE state IN ('succeeded', 'failed', 'cancelled')")[
                    0
                ][0]
                == 4
            ),
            90,
            "every run to finish",
        )
        facts = invariants(pg)
    finally:
        for agent in agents:
            agent.stop()
        for replica in replicas:
            replica.stop()
        redis.stop()
        pg.close()
    html_5xx = [s for s in seen if s[1] >= 500 and "html" in s[2]]
    assert not html_5xx, html_5xx[:3]
    assert not [s for s in seen if s[1] == 500], "a 500 answered a dependency outage"
    outage_answers = [s for s in seen if s[1] == 503]
    assert outage_answers, "no probe met an outage: the faults were not injected"
    for path, _, kind, body, retry_after in outage_answers:
        assert retry_after, f"{path}: 503 without Retry-After"
        if path.startswith("/api/"):
            assert json.loads(body)["code"] in ("cache_unavailable", "database_unavailable"), body
        else:
            assert kind.startswith("text/plain"), (path, kind, body)
    codes = {json.loads(s[3])["code"] for s in outage_answers if s[0].startswith("/api/")}
    assert {"cache_unavailable", "database_unavailable"} <= codes, codes
    logs = "".join(replica.logs() for replica in replicas)
    assert "Traceback" not in logs, logs[logs.index("Traceback") - 500 :][:3000]
    assert facts == {"runs": 4, "lost": 0, "expired": 0, "double_executions": 0, "unfinished": 0}, facts
    for agent in agents:
        assert "non-JSON" not in agent.log() and "HTTP 500" not in agent.log(), agent.log()[-3000:]
