"""Log transport benchmark on PostgreSQL: log throughput per worker, and what 16 logging jobs cost
the claim path.

    .venv/bin/python bench/logs.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_logs_bench

What it measures (docs/logs.md, docs/performance.md), first at the write-path boundary
(``actions.logs.log_append``: one transaction with both fences, the attempt log row, the segment
rows; HTTP, base64 and signature checks are not included), each worker a separate OS process
with its own connection, the chunks full (32 KiB: a stdout and a stderr segment of job-like
output lines, about 3x compressible):

* **one append**: its statements (the first of an attempt in a process, and a later one), then
  200 appends timed: wall, Python CPU and the PostgreSQL backend's CPU per append;
* **throughput per worker**: one worker appending as fast as the write path takes chunks, MiB/s;
  then 16 workers at once, MiB/s per worker and in all;
* **claims/s with and without logging, in one run**: the claim loop of bench/claim.py (4 claimer
  processes, ``lease_claim`` -> ``lease_release`` on a 1k backlog) runs for 12 windows of 2.5 s;
  in half of them (off, on, on, off, repeated: a steady drift of the shared machine's load weighs
  on both sides alike) 16 other workers' running jobs log at the agent's pace (a full chunk per
  second each, out of step: the server's default interval with the buffer full, i.e. 512 KiB/s
  in all). Claims are counted per window; the added cost is the drop of claims/s in the logging
  windows against the others. With it: each window's claims/s, the CPU the 16 loggers took
  (their processes and their PostgreSQL backends, from /proc) as a share of the machine, and how
  busy the machine was in each kind of window;
* **the same over signed HTTP** (bench/logs_http.py): one ``manage.py serve`` (the production
  server, cluster-control profile, Redis, this database); ``--http-clients`` claimers (4, threads
  of one process) loop claim -> starting -> running -> complete over HTTP, and 16 other workers,
  each holding a running lease, post a full chunk a second to ``POST /api/v1/worker/lease/log``
  from another process, in the same alternating windows. With it: each window's claim loops/s,
  the server's CPU (Python process tree and PostgreSQL) in both kinds of window, the server CPU
  per chunk and as a share of the machine, and the loggers' own client CPU (base64, signing).

The load average is printed first (and before the HTTP part). The benchmark database is wiped
(every QingLong table truncated) first, and again before the HTTP part. The last line is
machine-readable.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from claim import setup_django  # noqa: E402 - bench/claim.py, after the path above
from pgdb import ensure_database  # noqa: E402

CHUNK = 32 * 1024
LOGGERS = 16
CLAIMERS = 4
BACKLOG = 1_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/qinglong_logs_bench")
    parser.add_argument("--seconds", type=float, default=10.0, help="each throughput measurement")
    parser.add_argument("--windows", type=int, default=12, help="claim windows, half of them logging")
    parser.add_argument("--window", type=float, default=2.5, help="seconds per claim window")
    parser.add_argument(
        "--http-clients", type=int, default=CLAIMERS, help="HTTP claimers (threads of one process)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="serve the HTTP part here (default: first free of 8300-8399)",
    )
    args = parser.parse_args()
    ensure_database(args.pg_url)
    os.environ["QINGLONG_LOG_MAX_BYTES"] = str(1 << 40)  # measure the writes, not the cap
    os.environ["QINGLONG_LOG_RATE_BYTES_PER_SECOND"] = str(1 << 40)
    setup_django(args.pg_url)
    # These import Django models: only after django.setup().
    import claim_measure  # noqa: PLC0415
    import logs_http  # noqa: PLC0415
    import logs_measure  # noqa: PLC0415
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    reset_and_load = claim_measure.reset_and_load
    start_attempt, run_loggers, collect = (
        logs_measure.start_attempt,
        logs_measure.run_loggers,
        logs_measure.collect,
    )

    load = os.getloadavg()
    cores = os.cpu_count() or 1
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({cores} cores)", flush=True)
    call_command("migrate", verbosity=0)
    workers = reset_and_load(BACKLOG + 2 * LOGGERS + 2, CLAIMERS + LOGGERS + LOGGERS + 2)
    claimers, paced, flat_out, single, profiled = (
        workers[:CLAIMERS],
        workers[CLAIMERS : CLAIMERS + LOGGERS],
        workers[CLAIMERS + LOGGERS : CLAIMERS + 2 * LOGGERS],
        workers[-2],
        workers[-1],
    )
    paced_leases = [start_attempt(worker) for worker in paced]
    flat_leases = [start_attempt(worker) for worker in flat_out]
    single_lease = start_attempt(single)
    profile = logs_measure.profile_append(start_attempt(profiled))
    backend_ms = profile["backend_cpu_ms"]
    print(
        f"one append (32 KiB, 2 segments): {profile['statements']} statement(s) "
        f"(the first of an attempt in a process: {profile['statements_first']}); "
        f"{profile['wall_ms']:.2f} ms wall, {profile['cpu_ms']:.2f} ms Python CPU, "
        + (f"{backend_ms:.2f} ms PostgreSQL backend CPU" if backend_ms is not None else "backend CPU n/a")
    )
    for sql in profile["sql"]:
        print(f"  {sql}")
    context = multiprocessing.get_context("fork")
    seconds = args.seconds
    mib = 1024 * 1024

    connections.close_all()
    barrier, results, processes = run_loggers([single_lease], seconds, None, context)
    barrier.wait()
    [(sent, wall, _, _)] = collect(results, processes, seconds)
    one_worker = sent / wall / mib
    print(
        f"log throughput, 1 worker: {one_worker:.1f} MiB/s ({sent // CHUNK} chunks of 32 KiB in {wall:.1f} s)"
    )

    connections.close_all()
    barrier, results, processes = run_loggers(flat_leases, seconds, None, context)
    barrier.wait()
    figures = collect(results, processes, seconds)
    total = sum(sent / wall for sent, wall, _, _ in figures) / mib
    print(
        f"log throughput, {LOGGERS} workers at once: {total / LOGGERS:.3f} MiB/s per worker, "
        f"{total:.2f} MiB/s in all"
    )

    connections.close_all()
    split = logs_measure.alternating(claimers, paced_leases, args.windows, args.window, 1.0, context)
    quiet, logging = split["quiet"], split["logging"]
    windows = " ".join(f"{rate:.0f}{'*' if on else ''}" for rate, on in split["per_window"])
    print(
        f"claims/s, {CLAIMERS} claimers, in {args.windows} windows of {args.window:g} s "
        f"(* = {LOGGERS} jobs logging): {windows}"
    )
    print(
        f"claims/s, {CLAIMERS} claimers, no job logging: {quiet:.1f} (machine "
        f"{split['busy_quiet'] * 100:.0f} % busy); {LOGGERS} jobs logging: {logging:.1f} (machine "
        f"{split['busy_logging'] * 100:.0f} % busy)"
    )
    on_seconds, backend_cpu = split["on_seconds"], split["backend_cpu"]
    logger_cores = (split["logger_cpu"] + (backend_cpu or 0.0)) / on_seconds
    print(
        f"{LOGGERS} jobs logging: {split['logged_bytes'] / on_seconds / 1024:.0f} KiB/s in all; their "
        f"appends took {split['logger_cpu']:.2f} CPU-s in Python"
        + (f" + {backend_cpu:.2f} CPU-s in their PostgreSQL backends" if backend_cpu is not None else "")
        + f" in {on_seconds:g} s = {logger_cores / cores * 100:.1f} % of the machine's {cores} cores"
    )
    cost = 1 - logging / quiet
    print(f"added cost of {LOGGERS} jobs logging on claims/s: {cost * 100:.1f} %")

    load_http = os.getloadavg()
    http = logs_http.measure(
        args.pg_url,
        context,
        claimers=args.http_clients,
        loggers=LOGGERS,
        windows=args.windows,
        window=args.window,
        port=args.port,
    )
    windows = " ".join(f"{rate:.0f}{'*' if on else ''}" for rate, on in http["per_window"])
    print(
        f"over signed HTTP (manage.py serve, cluster-control; load average {load_http[0]:.2f}): "
        f"claim loops/s (claim, starting, running, complete), {args.http_clients} clients, in "
        f"{args.windows} windows of {args.window:g} s (* = {LOGGERS} jobs logging over HTTP): {windows}"
    )
    print(
        f"  claims/s, no job logging: {http['quiet']:.1f} (machine {http['busy_quiet'] * 100:.0f} % busy); "
        f"{LOGGERS} jobs logging: {http['logging']:.1f} (machine {http['busy_logging'] * 100:.0f} % busy)"
    )
    print(
        f"  {http['chunks']} chunks of 32 KiB in {http['on_seconds']:g} s "
        f"({http['logged_bytes'] / http['on_seconds'] / 1024:.0f} KiB/s), latency p50 "
        f"{http['chunk_p50_ms']:.1f} ms, p99 {http['chunk_p99_ms']:.1f} ms; largest interval answered "
        f"{http['max_interval']:g} s; {http['backpressure']} backpressure answer(s)"
    )
    print(
        f"  server CPU (Python + PostgreSQL), in cores: {http['server_cpu_quiet']:.2f} quiet "
        f"({http['python_cpu_quiet']:.2f} + {http['database_cpu_quiet']:.2f}), "
        f"{http['server_cpu_logging']:.2f} logging ({http['python_cpu_logging']:.2f} + "
        f"{http['database_cpu_logging']:.2f}); {http['server_ms_per_claim']:.2f} CPU-ms per claim "
        f"loop; the chunks: {http['chunk_server_ms']:.2f} CPU-ms each = "
        f"{http['chunk_server_cpu'] / cores * 100:.1f} % of the machine's {cores} cores"
    )
    print(
        f"  client CPU: the loggers' process {http['loggers_client_cpu'] / cores * 100:.1f} % of the "
        f"machine while logging (base64, signing, JSON; elsewhere in production), the claimers' "
        f"{http['claimers_client_cpu'] / cores * 100:.1f} %"
    )
    print(f"added cost of {LOGGERS} jobs logging over HTTP on claims/s: {http['cost'] * 100:.1f} %")
    load_end = os.getloadavg()
    print(f"load average at the end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    print(
        json.dumps(
            {
                "bench": "logs",
                "load_average_start": round(load[0], 2),
                "append_statements": profile["statements"],
                "append_statements_first": profile["statements_first"],
                "append_cpu_ms": round(profile["cpu_ms"], 3),
                "append_backend_cpu_ms": round(backend_ms, 3) if backend_ms is not None else None,
                "append_wall_ms": round(profile["wall_ms"], 3),
                "log_mib_per_s_one_worker": round(one_worker, 2),
                "log_mib_per_s_per_worker_16": round(total / LOGGERS, 3),
                "log_mib_per_s_total_16": round(total, 2),
                "claims_per_s_quiet": round(quiet, 1),
                "claims_per_s_16_logging": round(logging, 1),
                "claims_cost_ratio": round(cost, 4),
                "machine_busy_quiet": round(split["busy_quiet"], 3),
                "machine_busy_16_logging": round(split["busy_logging"], 3),
                "loggers_cpu_share": round(logger_cores / cores, 4),
                "load_average_http": round(load_http[0], 2),
                "http_claims_per_s_quiet": round(http["quiet"], 1),
                "http_claims_per_s_16_logging": round(http["logging"], 1),
                "http_claims_cost_ratio": round(http["cost"], 4),
                "http_machine_busy_quiet": round(http["busy_quiet"], 3),
                "http_machine_busy_16_logging": round(http["busy_logging"], 3),
                "http_chunk_server_cpu_ms": round(http["chunk_server_ms"], 3),
                "http_loggers_server_cpu_share": round(http["chunk_server_cpu"] / cores, 4),
                "http_loggers_client_cpu_share": round(http["loggers_client_cpu"] / cores, 4),
                "http_chunk_p50_ms": round(http["chunk_p50_ms"], 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
