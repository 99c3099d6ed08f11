"""Log transport benchmark on PostgreSQL: log throughput per worker, and what 16 logging jobs cost
the claim path.

    .venv/bin/python bench/logs.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_logs_bench

What it measures (docs/logs.md), at the write-path boundary (``actions.logs.log_append``: one
transaction with both fences, the attempt log row, the segment rows; HTTP, base64 and signature
checks are not included), each worker a separate OS process with its own connection:

* **throughput per worker**: one worker appending full chunks (32 KiB, two segments: stdout and
  stderr) to its running attempt as fast as the write path takes them, MiB/s; then 16 workers at
  once, MiB/s per worker and in all;
* **claims/s with and without logging**: the claim loop of bench/claim.py (4 claimer processes,
  ``lease_claim`` → ``lease_release`` on a 1k backlog) alone, then again while 16 other workers'
  running jobs log at the agent's pace (a 32 KiB chunk per second each: the server's default
  interval with the buffer full, i.e. 512 KiB/s in all). The added cost is the relative drop.

The benchmark database is wiped (every QingLong table truncated) first. The last line is
machine-readable.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
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
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    ensure_database(args.pg_url)
    os.environ["QINGLONG_LOG_MAX_BYTES"] = str(1 << 40)  # measure the writes, not the cap
    os.environ["QINGLONG_LOG_RATE_BYTES_PER_SECOND"] = str(1 << 40)
    setup_django(args.pg_url)
    # These import Django models: only after django.setup().
    import claim_measure  # noqa: PLC0415
    import logs_measure  # noqa: PLC0415
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    measure, reset_and_load = claim_measure.measure, claim_measure.reset_and_load
    start_attempt, run_loggers, collect, profile_append = (
        logs_measure.start_attempt,
        logs_measure.run_loggers,
        logs_measure.collect,
        logs_measure.profile_append,
    )

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
    profile = profile_append(start_attempt(profiled))
    print(
        f"one append (32 KiB, 2 segments): {profile['statements']} statements, row locks on "
        f"{', '.join(profile['locked'])}; {profile['wall_ms']:.1f} ms wall, "
        f"{profile['cpu_ms']:.1f} ms Python CPU, {profile['last_db_ms']:.1f} ms in statements"
    )
    for ms, sql in profile["slowest"]:
        print(f"  {ms:6.1f} ms  {sql}")
    context = multiprocessing.get_context("fork")
    seconds = args.seconds
    mib = 1024 * 1024

    connections.close_all()
    barrier, results, processes = run_loggers([single_lease], seconds, None, context)
    barrier.wait()
    [(sent, wall)] = collect(results, processes, seconds)
    one_worker = sent / wall / mib
    print(
        f"log throughput, 1 worker: {one_worker:.1f} MiB/s ({sent // CHUNK} chunks of 32 KiB in {wall:.1f} s)"
    )

    connections.close_all()
    barrier, results, processes = run_loggers(flat_leases, seconds, None, context)
    barrier.wait()
    figures = collect(results, processes, seconds)
    total = sum(sent / wall for sent, wall in figures) / mib
    print(
        f"log throughput, {LOGGERS} workers at once: {total / LOGGERS:.3f} MiB/s per worker, "
        f"{total:.2f} MiB/s in all"
    )

    connections.close_all()
    quiet = measure(claimers, seconds)
    print(
        f"claims/s, {CLAIMERS} claimers, no job logging: {quiet.per_second:.0f} (p99 {quiet.p99_ms:.1f} ms)"
    )

    connections.close_all()
    barrier, results, processes = run_loggers(paced_leases, seconds + 4, 1.0, context)
    barrier.wait()
    time.sleep(1.0)  # the loggers are under way
    busy = measure(claimers, seconds)
    logged = collect(results, processes, seconds + 4)
    logging_rate = sum(sent / wall for sent, wall in logged) / 1024
    print(
        f"claims/s, {CLAIMERS} claimers, {LOGGERS} jobs logging ({logging_rate:.0f} KiB/s in all): "
        f"{busy.per_second:.1f} (p99 {busy.p99_ms:.1f} ms)"
    )
    cost = 1 - busy.per_second / quiet.per_second
    print(f"added cost of {LOGGERS} jobs logging on claims/s: {cost * 100:.1f} %")
    print(
        json.dumps(
            {
                "bench": "logs",
                "append_statements": profile["statements"],
                "append_locks": profile["locked"],
                "append_cpu_ms": round(profile["cpu_ms"], 2),
                "append_wall_ms": round(profile["wall_ms"], 2),
                "log_mib_per_s_one_worker": round(one_worker, 2),
                "log_mib_per_s_per_worker_16": round(total / LOGGERS, 3),
                "log_mib_per_s_total_16": round(total, 2),
                "claims_per_s_quiet": round(quiet.per_second, 1),
                "claims_per_s_16_logging": round(busy.per_second, 1),
                "claims_cost_ratio": round(cost, 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
