"""The signed-HTTP half of the claim benchmark (bench/claim.py): claim + complete loops through
``manage.py serve``, the production server (Granian), in the cluster-control profile (Redis
nonces and rate limits at ``REDIS_URL``; the worker rate limit lifted).

Each of ``clients`` workers (one thread each, its own keep-alive connection, signing every request
exactly as the agent does with ``agent.client``) loops over the whole life of an attempt: its
offer → starting ACK → running ACK → complete ``succeeded``, the completion carrying the next
claim as the agent's does (docs/leases.md, "The next claim") — three signed calls per attempt
while the backlog lasts, and a claim of its own only for a worker's first. A loop completes a
run, so the backlog is sized to outlast the measurement.

The loops run ``WARM_UP_SECONDS`` before the measured window opens, uncounted: each server thread
opens its database and Redis connections and fills its caches on its first requests (from three
fresh servers, the first second's loops were 8, 14 and 23 % fewer than the next seven seconds'
mean), and ``pgbench`` too opens its connections before its clock starts. A loop counts when
it begins inside the window; the window closes when the last loop begun in it has ended.
Imported by bench/claim.py once ``django.setup()`` has run (it loads the backlog through
``claim_measure``).

Where the cores went (bench/cpu.py, read from ``/proc`` when the loops start and when they end):
the server's process tree (``manage.py serve``, its Granian workers: Python), the PostgreSQL
backends of the bench database plus the backends that ended meanwhile, this process (the 16
clients: JSON, signing, HTTP — in production they run on the workers' machines) and the whole
machine. Redis and the rest of the machine are what is left of the busy share.
"""

from __future__ import annotations

import os
import secrets
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass

import claim_measure  # bench/claim_measure.py
import cpu  # bench/cpu.py: who spent the CPU, from /proc
import heartbeat as hb  # bench/heartbeat.py: the server and the enrolled workers
import heartbeat_tokens

from agent.client import ApiError
from protocol import wire
from protocol.ids import uuid7

#: Seconds of loops before the measured window (module docstring).
WARM_UP_SECONDS = 2.0


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds each party spent while the loops ran, and the machine's (busy, total) seconds
    over all its cores."""

    server: float
    database: float
    clients: float
    machine_busy: float
    machine_total: float

    def per_loop_ms(self, loops: int) -> dict[str, float]:
        """Milliseconds of CPU per completed loop: server, database, clients, and ``other`` (the
        rest of the machine's busy time: Redis, the kernel's share not charged to a process,
        other tenants)."""
        other = self.machine_busy - self.server - self.database - self.clients
        parts = {"server": self.server, "database": self.database, "clients": self.clients, "other": other}
        return {name: 1000 * seconds / loops for name, seconds in parts.items()}


@dataclass(frozen=True)
class HttpFigures:
    loops: int
    empty: int
    warm_up_loops: int
    wall_seconds: float
    p50_ms: float
    p99_ms: float
    cpu: CpuSplit

    @property
    def per_second(self) -> float:
        return self.loops / self.wall_seconds

    @property
    def loop_cpu_ms(self) -> float:
        """The machine's CPU per loop, every party together (ms)."""
        return sum(self.cpu.per_loop_ms(self.loops).values())


def _offer() -> tuple[str, dict]:
    """A fresh lease token and the offer that carries it."""
    token = secrets.token_urlsafe(32)
    return token, {"offerId": str(uuid7()), "leaseToken": token}


def start_attempt(worker: hb.BenchWorker) -> dict | None:
    """Take the offer the worker's last completion claimed, or claim one over HTTP, and send its
    starting and running ACKs: the lease fence of the running attempt, or None when the claim
    found no work."""
    fence = worker.fence()
    if worker.next_offer is not None:
        (claimed, token, offer_id), worker.next_offer = worker.next_offer, None
    else:
        token, offer = _offer()
        offer_id = offer["offerId"]
        answer = worker.client.post(wire.CLAIM, {**fence, "offers": [offer]})
        if not answer["offers"]:
            return None
        claimed = answer["offers"][0]
    lease = claimed["lease"]
    held = {
        **fence,
        "attemptId": lease["attemptId"],
        "leaseGeneration": lease["leaseGeneration"],
        "leaseToken": token,
    }
    ack = worker.client.post(
        wire.LEASE_STARTING, {**held, "leaseVersion": lease["leaseVersion"], "offerId": offer_id}
    )
    worker.client.post(
        wire.LEASE_RUNNING,
        {
            **held,
            "leaseVersion": ack["lease"]["leaseVersion"],
            "offerId": offer_id,
            "pid": 4242,
            "executorHandle": "bench",
        },
    )
    return held


def _loop(worker: hb.BenchWorker) -> bool:
    """One attempt's life: its offer (from the last completion's next claim, else a claim) →
    starting → running → complete carrying the next claim, as the agent sends it; False when
    there was no work."""
    held = start_attempt(worker)
    if held is None:
        return False
    token, offer = _offer()
    answer = worker.client.post(
        wire.LEASE_COMPLETE,
        {**held, "sequence": 1, "outcome": "succeeded", "exitCode": 0, "next": {"offers": [offer]}},
    )
    offers = answer["next"]["offers"]
    worker.next_offer = (offers[0], token, offer["offerId"]) if offers else None
    return True


def measure(pg_url: str, *, clients: int, seconds: float, backlog: int) -> HttpFigures:
    """Load ``backlog`` runs, start the server, enroll ``clients`` workers over HTTP, run the loops."""
    claim_measure.reset_and_load(backlog, 0)
    env = {
        "DATABASE_URL": pg_url,
        "QINGLONG_PROFILE": "cluster-control",
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", secrets.token_urlsafe(40)),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        "QINGLONG_VAR_DIR": tempfile.mkdtemp(prefix="qinglong-bench-claim-"),
        "QINGLONG_RATE_WORKER": "100000000/m",
        "QINGLONG_RATE_ENROLL": "10000/m",
        "QINGLONG_LOG_LEVEL": "WARNING",
    }
    port = hb.free_port()
    server = hb.start_server(env, port)
    try:
        url = f"http://127.0.0.1:{port}"
        workers = hb.enroll_workers(url, heartbeat_tokens.issue_tokens(clients, secrets.token_hex(3)))
        claim_measure.vacuum_churned()  # as before every in-process window
        start = threading.Barrier(len(workers) + 1)
        window: list[float] = []  # when the measured window opens and when no loop may begin
        errors: list[str] = []
        done: list[tuple[list[float], int, int]] = []

        def run(worker: hb.BenchWorker) -> None:
            latencies: list[float] = []
            empty = warm_up = 0
            start.wait()
            try:
                while (began := time.perf_counter()) < window[1]:
                    found = _loop(worker)
                    if began < window[0]:
                        warm_up += 1
                    elif found:
                        latencies.append(time.perf_counter() - began)
                    else:
                        empty += 1
            except ApiError as exc:
                errors.append(str(exc))
            done.append((latencies, empty, warm_up))

        threads = [threading.Thread(target=run, args=(w,)) for w in workers]
        for thread in threads:
            thread.start()
        postmaster = cpu.postmaster_pid()

        def reading() -> dict:
            return {
                "server": cpu.cpu_by_pid(cpu.descendants(server.pid)),
                "backends": cpu.cpu_by_pid(cpu.backend_pids()),
                "ended_backends": cpu.reaped_cpu(postmaster),
                "clients": time.process_time(),
                "machine": cpu.machine_busy(),
            }

        opens = time.perf_counter() + WARM_UP_SECONDS
        window.extend([opens, opens + seconds])
        start.wait()
        time.sleep(max(0.0, opens - time.perf_counter()))
        began = time.perf_counter()
        before = reading()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - began
        after = reading()
        if errors:
            raise SystemExit(f"{len(errors)} HTTP loops failed, first: {errors[0]}")
        latencies = sorted(x for lat, _, _ in done for x in lat)
        if not latencies:
            raise SystemExit("no HTTP claim loop succeeded")
        p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
        split = CpuSplit(
            server=cpu.spent(before["server"], after["server"]),
            database=cpu.spent(before["backends"], after["backends"])
            + after["ended_backends"]
            - before["ended_backends"],
            clients=after["clients"] - before["clients"],
            machine_busy=after["machine"][0] - before["machine"][0],
            machine_total=after["machine"][1] - before["machine"][1],
        )
        return HttpFigures(
            len(latencies),
            sum(e for _, e, _ in done),
            sum(w for _, _, w in done),
            wall,
            statistics.median(latencies) * 1000,
            p99 * 1000,
            split,
        )
    finally:
        server.terminate()
        server.wait(10)
