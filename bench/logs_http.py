"""The signed-HTTP half of the log benchmark (bench/logs.py): claims/s through ``manage.py serve``
with and without 16 jobs logging over HTTP, and the server CPU their chunks take.

One control plane, ``manage.py serve`` started as bench/http_claims.py starts it (Granian, the
cluster-control profile, Redis nonces and rate limits at ``REDIS_URL``, PostgreSQL at the bench
database; the worker rate limit lifted, the output bucket ``QINGLONG_RATE_OUTPUT`` left as it
is). Every request is signed exactly as the agent signs it (``agent.client``), by enrolled
workers (bench/heartbeat.py). Two client processes, so that the loggers' client-side CPU (base64,
signing, JSON) is measured apart from the claimers' — in production the agents run elsewhere:

* **claimers** (one process, a thread and a keep-alive connection per worker): the loop of
  bench/http_claims.py, offer → starting → running → complete ``succeeded`` carrying the next
  claim (three signed calls, the whole life of an attempt); each completed loop is stamped;
* **loggers** (another process, a thread and a connection per worker): each worker holds a
  RUNNING lease (claimed, starting and running ACKed over HTTP before the measurement) and posts
  one full chunk a second to ``POST /api/v1/worker/lease/log`` — 32 KiB in a stdout and a stderr
  segment of job-like lines (bench/logs_measure.py), base64 in the body, with the lease fence and
  the next ``seq`` — out of step with each other, only in the "on" windows. A full chunk goes at
  once whatever ``intervalSeconds`` the answer names (the agent waits the interval only for a
  partial chunk), so a job writing 32 KiB/s sends one a second; a ``log_backpressure`` answer is
  honoured (the same chunk again after its Retry-After).

The windows are those of the in-process part (``logs_measure.window_on``: off, on, on, off …).
At each window boundary the parent reads from ``/proc`` (bench/cpu.py) the CPU of the server's process tree
(``manage.py serve`` and its Granian worker: Python), of PostgreSQL, of each client process, and
of the whole machine. Under ASGI every request opens its own database connection
(docs/deploy.md), so most backends live for one request: PostgreSQL's CPU is that of the
backends connected to the bench database at the boundary plus what the postmaster's ended
children used (cutime + cstime: backends of *any* database — the shared machine's other
connections add a little noise, alike in both kinds of window). The chunks' server-side CPU is
what the server (Python + PostgreSQL) spent in the "on" windows beyond what the claims of those
windows cost at the "off" windows' CPU per claim.
"""

from __future__ import annotations

import base64
import os
import secrets
import statistics
import tempfile
import threading
import time

import claim_measure  # bench/claim_measure.py
import cpu  # bench/cpu.py: who spent the CPU, from /proc
import heartbeat as hb  # bench/heartbeat.py: the server and the enrolled workers
import heartbeat_tokens
import logs_measure  # bench/logs_measure.py: the chunks and the windows
from django.db import connections
from http_claims import _loop as claim_loop  # bench/http_claims.py
from http_claims import start_attempt as start_running

from agent.client import ApiError, TransportError
from protocol import wire

#: Seconds between the children's start and the first window (connections warm up meanwhile).
LEAD_SECONDS = 2.0


def start_attempt(worker: hb.BenchWorker) -> dict:
    """Claim one attempt over HTTP and send its starting and running ACKs; the lease fence."""
    held = start_running(worker)
    if held is None:
        raise SystemExit("a logger found no run to claim")
    return held


def chunk_body(fence: dict, chunks: logs_measure.Chunks, seq: int) -> tuple[dict, int]:
    """The wire body of chunk ``seq`` (the agent's shape, ``agent.output.LogShipper._ship``)
    and its raw bytes."""
    chunk = chunks.chunk(seq)
    body = {
        **fence,
        "seq": seq,
        "segments": [
            {
                "stream": segment.stream,
                "offset": segment.offset,
                "content": base64.b64encode(segment.data).decode("ascii"),
            }
            for segment in chunk.segments
        ],
    }
    return body, chunk.size


def _claimers(workers: list[hb.BenchWorker], begin: float, end: float, results) -> None:
    """Claim loops from ``begin - LEAD_SECONDS`` (warming up) to ``end`` (``time.monotonic``);
    reports the completion time of each loop from ``begin`` on, the empty claims and errors."""
    stamps: list[float] = []
    empty: list[int] = [0]
    errors: list[str] = []

    def run(worker: hb.BenchWorker) -> None:
        time.sleep(max(0.0, begin - LEAD_SECONDS - time.monotonic()))
        try:
            while (now := time.monotonic()) < end:
                if claim_loop(worker):
                    if now >= begin:
                        stamps.append(time.monotonic() - begin)
                else:
                    empty[0] += 1
        except (ApiError, TransportError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(("claimers", {"stamps": stamps, "empty": empty[0]}, errors[0] if errors else None))


def _loggers(
    leases: list[tuple[hb.BenchWorker, dict]], begin: float, windows: int, window: float, pace: float, results
) -> None:
    """One full chunk every ``pace`` seconds per lease (phase-shifted by its index, as agents are
    not in step), sent only inside the "on" windows; reports the chunks, bytes, latencies, the
    intervals answered and the backpressure answers."""
    latencies: list[float] = []
    intervals: list[float] = []
    sent_bytes: list[int] = []
    backpressure: list[int] = []
    errors: list[str] = []

    def run(index: int, worker: hb.BenchWorker, fence: dict) -> None:
        chunks = logs_measure.Chunks(index)
        seq = tick = 0
        try:
            while (at := index / len(leases) * pace + tick * pace) < windows * window:
                tick += 1
                time.sleep(max(0.0, begin + at - time.monotonic()))
                if not logs_measure.window_on(int(at // window)):
                    continue
                seq += 1
                body, size = chunk_body(fence, chunks, seq)
                while True:
                    began = time.perf_counter()
                    try:
                        answer = worker.client.post(wire.LOG_APPEND, body)
                    except ApiError as exc:
                        if exc.code != "log_backpressure":
                            raise
                        backpressure.append(1)
                        time.sleep(exc.retry_after or 1.0)
                        continue
                    latencies.append(time.perf_counter() - began)
                    break
                if answer["status"] != "stored":
                    raise SystemExit(f"chunk {seq} answered {answer}")
                intervals.append(answer["intervalSeconds"])
                sent_bytes.append(size)
        except (ApiError, TransportError, SystemExit) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(target=run, args=(index, worker, fence))
        for index, (worker, fence) in enumerate(leases)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    figures = {
        "chunks": len(latencies),
        "bytes": sum(sent_bytes),
        "latencies": latencies,
        "max_interval": max(intervals, default=0.0),
        "backpressure": len(backpressure),
    }
    results.put(("loggers", figures, errors[0] if errors else None))


def server_env(pg_url: str) -> dict[str, str]:
    """The server's environment: bench/http_claims.py's (cluster-control, Redis, the bench DB)."""
    return {
        "DATABASE_URL": pg_url,
        "QINGLONG_PROFILE": "cluster-control",
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", secrets.token_urlsafe(40)),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        "QINGLONG_VAR_DIR": tempfile.mkdtemp(prefix="qinglong-bench-logs-"),
        "QINGLONG_RATE_WORKER": "100000000/m",
        "QINGLONG_RATE_ENROLL": "10000/m",
        "QINGLONG_LOG_LEVEL": "WARNING",
    }


def measure(
    pg_url: str,
    context,
    *,
    claimers: int,
    loggers: int,
    windows: int,
    window: float,
    pace: float = 1.0,
    backlog: int = 20_000,
    port: int | None = None,
) -> dict:
    """Load ``backlog`` runs, start the server, enroll ``claimers + loggers`` workers over HTTP,
    start the loggers' attempts, then run both client processes through ``windows`` windows of
    ``window`` seconds. Returns per-window claims/s and CPU (seconds) by party; see ``summary``."""
    claim_measure.reset_and_load(backlog, 0)
    env = server_env(pg_url)
    port = port or hb.free_port()
    server = hb.start_server(env, port)
    try:
        url = f"http://127.0.0.1:{port}"
        workers = hb.enroll_workers(
            url, heartbeat_tokens.issue_tokens(claimers + loggers, secrets.token_hex(3))
        )
        claiming, logging = workers[:claimers], workers[claimers:]
        leases = [(worker, start_attempt(worker)) for worker in logging]
        for worker in workers:  # the children open their own connections
            worker.client.close()
        connections.close_all()
        seconds = windows * window
        results = context.Queue()
        begin = time.monotonic() + LEAD_SECONDS + 0.5
        children = [
            context.Process(target=_claimers, args=(claiming, begin, begin + seconds, results)),
            context.Process(target=_loggers, args=(leases, begin, windows, window, pace, results)),
        ]
        for child in children:
            child.start()
        postmaster = cpu.postmaster_pid()
        readings = []
        for index in range(windows + 1):  # every party's CPU at each window boundary
            time.sleep(max(0.0, begin + index * window - time.monotonic()))
            readings.append(
                {
                    "machine": cpu.machine_busy(),
                    "server": cpu.cpu_by_pid(cpu.descendants(server.pid)),
                    "backends": cpu.cpu_by_pid(cpu.backend_pids()),
                    "ended_backends": cpu.reaped_cpu(postmaster),
                    "claimers": cpu.process_cpu(children[0].pid) or 0.0,
                    "loggers": cpu.process_cpu(children[1].pid) or 0.0,
                }
            )
        got = {
            kind: (figures, error) for kind, figures, error in (results.get(timeout=120) for _ in children)
        }
        for child in children:
            child.join(30)
        errors = [error for _, error in got.values() if error]
        if errors:
            raise SystemExit(f"an HTTP claimer or logger failed: {errors[0]}")
        return summary(got["claimers"][0], got["loggers"][0], readings, windows, window)
    finally:
        server.terminate()
        server.wait(10)


def summary(claimed: dict, logged: dict, readings: list[dict], windows: int, window: float) -> dict:
    """The figures of one run: ``quiet`` and ``logging`` claims/s (loops/s), ``per_window``
    ((claims/s, on) in order), ``cost`` (1 - logging/quiet), the server's CPU (CPU-s per s) in
    off and on windows, in all and split into Python (``python_cpu_*``: the process tree) and
    PostgreSQL (``database_cpu_*``), ``chunk_server_cpu`` (CPU-s per s the chunks
    took: the on windows' server CPU beyond their claims at the off windows' CPU per claim),
    ``chunk_server_ms`` (per chunk), the loggers' and claimers' client CPU (CPU-s per s of the
    windows they work in), the machine's busy share in off/on windows, and the chunks' latency."""
    counts = [0] * windows
    for stamp in claimed["stamps"]:
        counts[min(windows - 1, int(stamp // window))] += 1
    on = [logs_measure.window_on(index) for index in range(windows)]
    on_seconds = sum(on) * window
    off_seconds = windows * window - on_seconds

    def per_window(key: str) -> list[float]:
        spent = []
        for index in range(windows):
            before, after = readings[index][key], readings[index + 1][key]
            spent.append(cpu.spent(before, after) if isinstance(before, dict) else after - before)
        return spent

    python = per_window("server")
    database = [a + b for a, b in zip(per_window("backends"), per_window("ended_backends"), strict=True)]
    server = [a + b for a, b in zip(python, database, strict=True)]
    loggers_cpu, claimers_cpu = per_window("loggers"), per_window("claimers")

    def total(values: list[float], which: bool) -> float:
        return sum(v for v, o in zip(values, on, strict=True) if o == which)

    def busy(which: bool) -> float:
        spent = sum(
            readings[i + 1]["machine"][0] - readings[i]["machine"][0]
            for i in range(windows)
            if on[i] == which
        )
        elapsed = sum(
            readings[i + 1]["machine"][1] - readings[i]["machine"][1]
            for i in range(windows)
            if on[i] == which
        )
        return spent / elapsed if elapsed else 0.0

    claims_off, claims_on = total(counts, False), total(counts, True)
    per_claim = total(server, False) / claims_off if claims_off else 0.0
    chunk_cpu = total(server, True) - per_claim * claims_on
    latencies = sorted(logged["latencies"])
    return {
        "quiet": claims_off / off_seconds,
        "logging": claims_on / on_seconds,
        "per_window": [(count / window, o) for count, o in zip(counts, on, strict=True)],
        "cost": 1 - (claims_on / on_seconds) / (claims_off / off_seconds) if claims_off else 0.0,
        "server_cpu_quiet": total(server, False) / off_seconds,
        "server_cpu_logging": total(server, True) / on_seconds,
        "server_ms_per_claim": per_claim * 1000,
        "python_cpu_quiet": total(python, False) / off_seconds,
        "python_cpu_logging": total(python, True) / on_seconds,
        "database_cpu_quiet": total(database, False) / off_seconds,
        "database_cpu_logging": total(database, True) / on_seconds,
        "chunk_server_cpu": chunk_cpu / on_seconds,
        "chunk_server_ms": chunk_cpu / logged["chunks"] * 1000 if logged["chunks"] else 0.0,
        "loggers_client_cpu": total(loggers_cpu, True) / on_seconds,
        "claimers_client_cpu": sum(claimers_cpu) / (windows * window),
        "busy_quiet": busy(False),
        "busy_logging": busy(True),
        "chunks": logged["chunks"],
        "logged_bytes": logged["bytes"],
        "on_seconds": on_seconds,
        "chunk_p50_ms": statistics.median(latencies) * 1000 if latencies else 0.0,
        "chunk_p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000 if latencies else 0.0,
        "max_interval": logged["max_interval"],
        "backpressure": logged["backpressure"],
        "empty_claims": claimed["empty"],
    }
