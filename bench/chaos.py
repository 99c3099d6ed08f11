"""``make chaos``: faults against a private cluster-profile control plane, invariants checked after.

Starts its own PostgreSQL cluster and Redis server on ports 17200-17299 (``--first-port``), two
``manage.py serve`` replicas (cluster profile, both sweeping), real agents with their real job
guards and simulated workers speaking the signed protocol (``tests.agent.fleet``). They reach the
replicas through a load balancer (``TcpProxy`` over both ports: each connection goes to the next
replica that accepts it), as a deployment has them, except one agent, which talks to replica A
through a TCP proxy that can drop its traffic. Then it injects, one after the other:

1. SIGKILL of replica A (restarted after 5 s);
2. Redis stopped for twice the heartbeat interval;
3. PostgreSQL restarted (fast shutdown, 3 s down);
4. the proxied agent partitioned until the end (its attempt must be lost and retried elsewhere,
   never run twice at once).

Meanwhile both replicas are probed (a worker call, an operator token, an admin session cookie).
Afterwards it reads the database and the jobs' own timestamps and prints the figures, ending with
one machine-readable line::

    runs=<n> lost=<n> double_executions=<n> http_5xx=<n> html_500=<n>

``lost``: attempts settled lost (the partitioned agent's: 1 expected, and its session expired);
``double_executions``: runs whose two attempts' jobs overlapped in time (job-side timestamps) or
whose retry started before the lost attempt ended (database); ``http_5xx``: 5xx answers other
than a catalogued JSON 503 with ``Retry-After`` (probes, simulated workers, agents' logs);
``html_500``: 5xx answers with an HTML body. Exits 1 if any invariant broke (a double execution,
an HTML or uncatalogued 5xx, an expired session or lost attempt beyond the partitioned agent's, a
run not succeeded). Bounded: every wait has a deadline; about three to four minutes in all.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.agent.cluster import (  # noqa: E402 - after the path
    Agent,
    PrivatePostgres,
    PrivateRedis,
    Replica,
    TcpProxy,
    control_plane_env,
    create_task,
    free_ports,
    invariants,
    manage,
    poll,
)
from tests.agent.fleet import Fleet  # noqa: E402
from tests.agent.test_dependency_outages import probe_all  # noqa: E402

HEARTBEAT = 4
LEASE = 12
LOST_AFTER = 20
JOB_SECONDS = 75
TIMINGS = {
    "QINGLONG_SESSION_LEASE_SECONDS": str(LEASE),
    "QINGLONG_HEARTBEAT_INTERVAL_SECONDS": str(HEARTBEAT),
    "QINGLONG_RUN_LEASE_SECONDS": str(LEASE),
    "QINGLONG_OUTAGE_GRACE_SECONDS": "15",
    "QINGLONG_LIVENESS_BEAT_SECONDS": "1",
    "QINGLONG_OUTAGE_AFTER_SECONDS": "3",
    "QINGLONG_LOST_AFTER_SECONDS": str(LOST_AFTER),
    "QINGLONG_DISPATCH_HOLD_SECONDS": "0",
    "QINGLONG_RATE_WORKER": "6000/m",
}


def job_command(ticks: Path) -> str:
    """Ticks every second for JOB_SECONDS; a retry (the file already has ticks) ticks 3 s."""
    return (
        f"n={JOB_SECONDS}; [ -s {ticks} ] && n=3; "
        f"for i in $(seq 1 $n); do echo $$ $(date +%s.%N) >> {ticks}; sleep 1; done"
    )


def overlaps(ticks: Path) -> int:
    """1 if two processes' tick intervals in ``ticks`` overlap (a double execution), else 0."""
    if not ticks.exists():
        return 0
    spans: dict[str, list[float]] = {}
    for line in ticks.read_text().splitlines():
        pid, stamp = line.split()[:2]
        spans.setdefault(pid, []).append(float(stamp))
    ordered = sorted((min(v), max(v)) for v in spans.values())
    return int(any(later[0] < earlier[1] for earlier, later in zip(ordered, ordered[1:], strict=False)))


def simulated_fleet(env: dict[str, str], server: str, count: int) -> Fleet:
    """``count`` simulated workers holding running leases, set up in this process (Django on the
    private database, ``bench/chaos_fleet.py``) and driven over HTTP (``tests.agent.fleet``)."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")
    django.setup()
    import chaos_fleet  # noqa: PLC0415  (it imports Django models: only after django.setup())

    return chaos_fleet.simulated_fleet(server, count, heartbeat=HEARTBEAT, lease=LEASE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-port", type=int, default=17200)
    parser.add_argument("--last-port", type=int, default=17299)
    parser.add_argument("--agents", type=int, default=3, help="real agents (one more is partitioned)")
    parser.add_argument("--simulated", type=int, default=40, help="simulated workers")
    args = parser.parse_args()
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="qinglong-chaos-"))
    pg_port, redis_port, port_a, port_b, proxy_port, balancer_port = free_ports(
        args.first_port, args.last_port, 6
    )
    pg = PrivatePostgres(root, pg_port)
    redis = PrivateRedis(root, redis_port)
    replicas: list[Replica] = []
    agents: list[Agent] = []
    proxy = balancer = None
    fleet = None
    seen: list[tuple[str, int, str, str, str]] = []
    try:
        pg.start()
        pg.create_database()
        redis.start()
        env = control_plane_env(pg, redis.url, root / "var", **TIMINGS)
        manage(env, "migrate", "--no-input")
        replica_a, replica_b = Replica(root, port_a, env, "a"), Replica(root, port_b, env, "b")
        replicas = [replica_a, replica_b]
        for replica in replicas:
            replica.start()
        proxy = TcpProxy(proxy_port, port_a)
        balancer = TcpProxy(balancer_port, port_a, port_b)  # the replicas' load balancer
        behind_balancer = f"http://127.0.0.1:{balancer_port}"
        agents = [Agent(root, f"chaos-{n}") for n in range(args.agents)]
        partitioned = Agent(root, "chaos-partitioned")
        for agent in agents:
            agent.enroll(env, behind_balancer)
        partitioned.enroll(env, f"http://127.0.0.1:{proxy_port}")
        ticks = [root / f"ticks-{n}" for n in range(args.agents + 1)]
        # The partitioned agent starts first and alone, so that it holds the first run.
        create_task(env, "chaos-0", job_command(ticks[0]), runs=1, lost_retry="idempotent")
        partitioned.start()
        poll(
            lambda: pg.query("SELECT count(*) FROM runs_runattempt WHERE state = 'running'")[0][0] == 1,
            60,
            "the partitioned agent's job",
        )
        for n in range(1, args.agents + 1):
            create_task(env, f"chaos-{n}", job_command(ticks[n]), runs=1, lost_retry="idempotent")
        for agent in agents:
            agent.start("--max-concurrent", "1")  # busy with their job: the simulated runs stay free
        poll(
            lambda: (
                pg.query("SELECT count(*) FROM runs_runattempt WHERE state = 'running'")[0][0]
                == args.agents + 1
            ),
            60,
            "every agent's job running",
        )
        fleet = simulated_fleet(env, behind_balancer, args.simulated)
        fleet.start()
        time.sleep(LEASE / 2)
        print(
            f"[chaos] running: {args.agents + 1} agent jobs, {args.simulated} simulated workers", flush=True
        )

        print("[chaos] fault 1: SIGKILL replica a", flush=True)
        replica_a.kill()
        for _ in range(5):
            probe_all([replica_b], seen)
            time.sleep(1)
        replica_a.start()
        time.sleep(HEARTBEAT)

        print(f"[chaos] fault 2: Redis stopped for {2 * HEARTBEAT}s", flush=True)
        redis.stop()
        stop_at = time.monotonic()
        while time.monotonic() - stop_at < 2 * HEARTBEAT:
            probe_all(replicas, seen)
            time.sleep(0.5)
        redis.start()
        time.sleep(HEARTBEAT)

        print("[chaos] fault 3: PostgreSQL restarted", flush=True)
        pg.stop("fast")
        down_at = time.monotonic()
        # Probed meanwhile, but the database comes back after 3 s whatever the probes wait for
        # (a 503 there takes the server's pool wait, 2 s): the outage stays shorter than a lease.
        probing = threading.Thread(target=probe_all, args=(replicas, seen), daemon=True)
        probing.start()
        time.sleep(max(0.0, 3 - (time.monotonic() - down_at)))
        pg.start()
        probing.join(60)
        probe_all(replicas, seen)
        time.sleep(HEARTBEAT)

        print("[chaos] fault 4: the proxied agent partitioned", flush=True)
        proxy.partitioned.set()
        fleet.finish()
        poll(fleet.done, 4 * LEASE, "every simulated worker's completion")
        poll(
            lambda: (
                pg.query(
                    "SELECT count(*) FROM runs_run WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"
                )[0][0]
                == 0
            ),
            JOB_SECONDS + LEASE + LOST_AFTER + 90,
            "every run to finish",
        )
        facts = invariants(pg)
        job_side = sum(overlaps(path) for path in ticks)
    finally:
        if fleet is not None:
            fleet.stop()
        for agent in [*agents, *([partitioned] if "partitioned" in locals() else [])]:
            agent.process is not None and agent.process.kill()
        for replica in replicas:
            replica.stop()
        for each in (proxy, balancer):
            if each is not None:
                each.close()
        redis.stop()
        pg.close()
    probes_5xx = [
        s
        for s in seen
        if s[1] >= 500 and not (s[1] == 503 and s[4] and ("json" in s[2] or "text/plain" in s[2]))
    ]
    html = [s for s in seen if s[1] >= 500 and "html" in s[2]]
    fleet_5xx = sum(
        n
        for (status, code), n in fleet.answers.items()
        if status >= 500 and (status != 503 or not code or code == "html")
    )
    fleet_html = sum(n for (status, code), n in fleet.answers.items() if status >= 500 and code == "html")
    agent_logs = "".join(agent.log() for agent in [*agents, partitioned])
    agent_html = agent_logs.count("with a non-JSON body") + agent_logs.count("without an error code")
    replica_logs = "".join(replica.logs() for replica in replicas)
    http_5xx = len(probes_5xx) + fleet_5xx + agent_html
    html_500 = len(html) + fleet_html + agent_html
    catalogued = sum(1 for s in seen if s[1] == 503) + sum(
        n for (status, _), n in fleet.answers.items() if status == 503
    )
    print(
        f"[chaos] {facts}; job-side overlaps {job_side}; catalogued 503 answers {catalogued}; "
        f"tracebacks in replica logs {replica_logs.count('Traceback')}; {time.monotonic() - started:.0f}s"
    )
    double = max(facts["double_executions"], job_side)
    print(
        f"runs={facts['runs']} lost={facts['lost']} double_executions={double} "
        f"http_5xx={http_5xx} html_500={html_500}"
    )
    # The partitioned agent's session expires and its attempt is lost: one each, by design.
    broken = (
        double or http_5xx or html_500 or facts["expired"] > 1 or facts["unfinished"] or facts["lost"] > 1
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
