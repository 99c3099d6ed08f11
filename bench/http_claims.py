"""The signed-HTTP half of the claim benchmark (bench/claim.py): claim + complete loops through
``manage.py serve``, the production server (Granian), in the cluster-control profile (Redis
nonces and rate limits at ``REDIS_URL``; the worker rate limit lifted).

Each of ``clients`` workers (one thread each, its own keep-alive connection, signing every request
exactly as the agent does with ``agent.client``) loops: claim one offer → starting ACK → running
ACK → complete ``succeeded`` — four signed calls, the whole life of an attempt. A loop completes a
run, so the backlog is sized to outlast the measurement. Imported by bench/claim.py once
``django.setup()`` has run (it loads the backlog through ``claim_measure``).
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
import heartbeat as hb  # bench/heartbeat.py: the server and the enrolled workers
import heartbeat_tokens

from agent.client import ApiError
from protocol import wire
from protocol.ids import uuid7


@dataclass(frozen=True)
class HttpFigures:
    loops: int
    empty: int
    wall_seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def per_second(self) -> float:
        return self.loops / self.wall_seconds


def start_attempt(worker: hb.BenchWorker) -> dict | None:
    """Claim one offer over HTTP and send its starting and running ACKs: the lease fence of the
    running attempt, or None when the claim found no work."""
    token = secrets.token_urlsafe(32)
    offer_id = str(uuid7())
    fence = worker.fence()
    answer = worker.client.post(wire.CLAIM, {**fence, "offers": [{"offerId": offer_id, "leaseToken": token}]})
    if not answer["offers"]:
        return None
    lease = answer["offers"][0]["lease"]
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
    """One claim → starting → running → complete; False when the claim found no work."""
    held = start_attempt(worker)
    if held is None:
        return False
    worker.client.post(wire.LEASE_COMPLETE, {**held, "sequence": 1, "outcome": "succeeded", "exitCode": 0})
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
        deadline: list[float] = []
        errors: list[str] = []
        done: list[tuple[list[float], int]] = []

        def run(worker: hb.BenchWorker) -> None:
            latencies: list[float] = []
            empty = 0
            start.wait()
            try:
                while time.perf_counter() < deadline[0]:
                    began = time.perf_counter()
                    if _loop(worker):
                        latencies.append(time.perf_counter() - began)
                    else:
                        empty += 1
            except ApiError as exc:
                errors.append(str(exc))
            done.append((latencies, empty))

        threads = [threading.Thread(target=run, args=(w,)) for w in workers]
        for thread in threads:
            thread.start()
        deadline.append(time.perf_counter() + seconds)
        began = time.perf_counter()
        start.wait()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - began
        if errors:
            raise SystemExit(f"{len(errors)} HTTP loops failed, first: {errors[0]}")
        latencies = sorted(x for lat, _ in done for x in lat)
        if not latencies:
            raise SystemExit("no HTTP claim loop succeeded")
        p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
        return HttpFigures(
            len(latencies), sum(e for _, e in done), wall, statistics.median(latencies) * 1000, p99 * 1000
        )
    finally:
        server.terminate()
        server.wait(10)
