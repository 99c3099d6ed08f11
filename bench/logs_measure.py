"""The half of the log benchmark (bench/logs.py) that imports Django models: the running attempts
and the logger processes. bench/logs.py imports it once ``django.setup()`` has run."""

from __future__ import annotations

import re
import secrets
import time

from django.db import connection
from django.test.utils import CaptureQueriesContext

from actions.leases.activation import lease_running, lease_starting
from actions.leases.claims import OfferRequest, lease_claim
from actions.logs import Chunk, Segment, log_append
from protocol.ids import uuid7

CHUNK = 32 * 1024


def start_attempt(worker) -> tuple:
    """Claim one attempt for ``worker`` and send its starting and running ACKs."""
    token, offer_id = secrets.token_urlsafe(32), uuid7()
    fence = {"worker_id": worker.worker_id, "session_id": worker.session_id, "generation": worker.generation}
    [offer] = lease_claim(**fence, offers=[OfferRequest(offer_id, token)])
    lease = {
        **fence,
        "attempt_id": offer.lease.attempt_id,
        "lease_generation": offer.lease.lease_generation,
        "lease_token": token,
    }
    lease_starting(**lease, offer_id=offer_id, lease_version=0)
    lease_running(**lease, offer_id=offer_id, lease_version=0, pid=4242, pgid=4242, executor_handle="bench")
    return lease


def profile_append(lease: dict, appends: int = 20) -> dict:
    """One attempt's appends in this process, profiled: statements per append, the tables each
    append locks (``FOR UPDATE``), database time vs Python CPU per append (ms)."""
    half = b"x" * (CHUNK // 2 - 1) + b"\n"
    statements: list[dict] = []
    wall = cpu = 0.0
    for seq in range(1, appends + 1):
        offset = (seq - 1) * len(half)
        chunk = Chunk(seq, (Segment("stdout", offset, half), Segment("stderr", offset, half)))
        started, started_cpu = time.perf_counter(), time.process_time()
        with CaptureQueriesContext(connection) as captured:
            log_append(**lease, chunk=chunk)
        wall += time.perf_counter() - started
        cpu += time.process_time() - started_cpu
        statements = list(captured.captured_queries)
    locked = sorted(
        {
            m.group(1)
            for q in statements
            if "FOR UPDATE" in q["sql"]
            for m in [re.search(r'FROM "(\w+)"', q["sql"])]
            if m
        }
    )
    db_ms = sum(float(q["time"]) for q in statements) * 1000
    return {
        "statements": len([q for q in statements if q["sql"] not in ("BEGIN", "COMMIT")]),
        "locked": locked,
        "wall_ms": wall / appends * 1000,
        "cpu_ms": cpu / appends * 1000,
        "last_db_ms": db_ms,
        "slowest": sorted(((float(q["time"]) * 1000, q["sql"][:70]) for q in statements), reverse=True)[:4],
    }


def logger(lease: dict, barrier, seconds: float, pace: float | None, results) -> None:
    half = b"x" * (CHUNK // 2 - 1) + b"\n"
    sent = 0
    try:
        barrier.wait()
        started = time.perf_counter()
        deadline = started + seconds
        seq = 0
        while time.perf_counter() < deadline:
            seq += 1
            offset = (seq - 1) * len(half)
            chunk = Chunk(seq, (Segment("stdout", offset, half), Segment("stderr", offset, half)))
            log_append(**lease, chunk=chunk)
            sent += chunk.size
            if pace is not None:
                time.sleep(max(0.0, started + seq * pace - time.perf_counter()))
        results.put((sent, time.perf_counter() - started, None))
    except Exception as exc:  # report, do not hang the parent
        results.put((sent, 0.0, f"{type(exc).__name__}: {exc}"))
    finally:
        connection.close()


def run_loggers(leases: list[dict], seconds: float, pace: float | None, context):
    """Start one logger process per lease; returns (barrier, results, processes) once started."""
    barrier = context.Barrier(len(leases) + 1)
    results = context.Queue()
    processes = [
        context.Process(target=logger, args=(lease, barrier, seconds, pace, results)) for lease in leases
    ]
    for process in processes:
        process.start()
    return barrier, results, processes


def collect(results, processes, seconds: float) -> list[tuple[int, float]]:
    got = [results.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(30)
    errors = [error for _, _, error in got if error]
    if errors:
        raise SystemExit(f"a logger failed: {errors[0]}")
    return [(sent, wall) for sent, wall, _ in got]
