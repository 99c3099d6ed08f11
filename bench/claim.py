"""Claim-path benchmark on PostgreSQL: claims/s and p50/p99 claim latency, next to pgbench.

    .venv/bin/python bench/claim.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_bench

What it measures (docs/protocol.md, Benchmarks: a 100k backlog must cost a claim no more than a small one):

* a backlog of exactly N pending runs (N = 1,000 and 100,000), bulk-loaded with two
  ``INSERT … SELECT generate_series`` statements (runs, then their first attempts) — no
  per-row round trips, no events for the fixture rows;
* C concurrent claimers (C = 1, 4, 16), each with its own database connection, its own worker and
  session (maximum concurrency 1), all started by one barrier, run the way ``manage.py serve``
  runs claims: on threads of bench/heartbeat.py's ``SERVER_PROCESSES`` OS processes (2, as
  deployed: 2 × 8 threads at 16; each thread keeps a plain connection, where serve's threads share
  a pool, and no event loop runs beside them) — the figures of the last line; then, always right
  after them, the 16 again as 16 processes of one thread each (the shape every run before
  2026-12-07 21:00 measured, 16 Python processes on the machine's cores, which no deployment
  runs), printed beside them so that the series stays comparable;
* each claimer loops: ``lease_claim`` (one offer, timed) → ``lease_release`` (not timed). The
  release hands the attempt back to the queue under the same number and queue position, so the
  backlog stays at exactly N pending runs for the whole measurement and no worker runs out of
  capacity. ``claims/s`` is successful claims per wall-clock second of that loop (so it also
  pays for the releases); the latency percentiles are of ``lease_claim`` alone, measured at the
  service boundary (one full transaction: worker lock, fence, keyset page, placement match, run
  lock, lease insert, events, commit) — HTTP and signature checks are not included;
* the plan of the dispatch-queue page query at each backlog size (``EXPLAIN ANALYZE``): it must be
  an index scan of the partial index ``attempt_dispatch_queue`` touching a constant number of
  buffers, whatever N is;
* ``pgbench``'s built-in TPC-B-like script on the same server in the same run (scale 10, 16
  clients), in its own database ``<bench database>_pgbench``, created and dropped here: run
  before the in-process claims, after them and after the HTTP loops (``--pgbench-seconds`` each).
  Each ratio divides by the mean of the two runs around its figure (``pgdb.PgBench``): on this
  shared machine pgbench's rate drifts by a tenth or more within a minute, so a single run at the
  end divided the first figures by another window's machine.

The benchmark database is wiped (every QingLong table truncated) before each backlog: point it at
a database that holds nothing you want. The last line is machine-readable; its ``pgbench_tps`` is
the mean of the runs (three, or two with ``--skip-http``). When the two runs around a figure are
more than ``pgdb.UNSTEADY`` apart, a warning above the ratios says that window cannot be compared.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import django
from django.core.management import call_command
from pgdb import PgBench, dbname, ensure_database  # bench/pgdb.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BACKLOGS = (1_000, 100_000)
CONCURRENCY = (1, 4, 16)
HTTP_TARGET = 0.06  # issue 13: signed-HTTP claim + complete loops per pgbench transaction


def _label(backlog: int) -> str:
    return f"{backlog // 1000}k"


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")
    # Leases and sessions must not lapse during a measurement; the ranking hold is irrelevant
    # (the backlog is older than it) but pinned so that the figures never depend on it.
    os.environ["QINGLONG_SESSION_LEASE_SECONDS"] = "86400"
    os.environ["QINGLONG_DISPATCH_TIMEOUT_SECONDS"] = "86400"
    os.environ["QINGLONG_RUN_LEASE_SECONDS"] = "86400"
    os.environ["QINGLONG_DISPATCH_HOLD_SECONDS"] = "0"
    os.environ["QINGLONG_LOG_LEVEL"] = "WARNING"
    django.setup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg-url", required=True, help="benchmark database (wiped), e.g. postgres://…/qinglong_bench"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement per (backlog, concurrency)")
    parser.add_argument(
        "--pgbench-seconds", type=int, default=6, help="each of the pgbench runs around the figures"
    )
    parser.add_argument(
        "--http-backlog", type=int, default=20_000, help="runs for the HTTP loops (each completes one)"
    )
    parser.add_argument(
        "--skip-http", action="store_true", help="no signed-HTTP loops (in-process and pgbench only)"
    )
    args = parser.parse_args()
    if not args.pg_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("the claim benchmark runs on PostgreSQL only")

    ensure_database(args.pg_url)
    setup_django(args.pg_url)
    import claim_measure  # noqa: PLC0415  (it imports Django models: only after django.setup())
    import http_claims  # noqa: PLC0415  (the same)
    from heartbeat import SERVER_PROCESSES  # noqa: PLC0415  (the same; the processes serve runs)

    if SERVER_PROCESSES < 1:
        raise SystemExit(f"QINGLONG_SERVER_PROCESSES must be at least 1, not {SERVER_PROCESSES}")

    call_command("migrate", verbosity=0)
    print(
        f"claim benchmark on {urlsplit(args.pg_url).hostname}/{dbname(args.pg_url)}: "
        f"{args.seconds:g}s per point, claim (timed) → release (untimed) per loop, {os.cpu_count()} CPUs"
    )
    with PgBench(args.pg_url) as pgbench:
        clients = max(CONCURRENCY)
        _pgbench(pgbench, args.pgbench_seconds, clients, "before the in-process claims")
        figures: dict[tuple[int, int], claim_measure.Figures] = {}
        apart: dict[int, claim_measure.Figures] = {}
        for backlog in BACKLOGS:
            print(f"backlog {backlog:,} pending runs", flush=True)
            claimers = claim_measure.reset_and_load(backlog, clients)
            scan, execution_ms, buffers = claim_measure.queue_plan()
            print(f"  queue page plan: {scan}")
            print(f"  queue page: {execution_ms:.3f} ms, {buffers} shared buffers")
            for concurrency in CONCURRENCY:
                result = claim_measure.measure(
                    claimers[:concurrency], args.seconds, processes=SERVER_PROCESSES
                )
                figures[(backlog, concurrency)] = result
                _print_point(concurrency, result)
            apart[backlog] = claim_measure.measure(claimers, args.seconds)
            _print_point(clients, apart[backlog])
        print(f"backlog {BACKLOGS[0]:,} pending runs again, after the larger one", flush=True)
        claimers = claim_measure.reset_and_load(BACKLOGS[0], clients)
        small_again = claim_measure.measure(claimers, args.seconds, processes=SERVER_PROCESSES)
        _print_point(clients, small_again)
        _pgbench(pgbench, args.pgbench_seconds, clients, "after them")
        in_process_tps = PgBench.bracket(*pgbench.runs[-2:])
        http = None
        if not args.skip_http:
            http = _http_loops(http_claims, args, clients)
            _pgbench(pgbench, args.pgbench_seconds, clients, "after the HTTP loops")
        runs = pgbench.runs
    http_tps = PgBench.bracket(*runs[-2:])
    http_per_second = http.per_second if http else float("nan")
    if http is not None:
        # The machine's CPU a loop may cost for 0.06x of pgbench, all parties together.
        budget = 1000 * (os.cpu_count() or 1) / (HTTP_TARGET * http_tps)
        print(
            f"  at {HTTP_TARGET}x of {http_tps:.0f} tps ({HTTP_TARGET * http_tps:.0f} loops/s) "
            "a loop may cost "
            f"{budget:.2f} ms of CPU on {os.cpu_count()} cores, all parties together; "
            f"it cost {http.loop_cpu_ms:.2f} ms"
        )
    for warning in (
        PgBench.unsteady(*runs[:2], "the in-process claims"),
        PgBench.unsteady(*runs[-2:], "the HTTP loops") if http is not None else None,
    ):
        if warning:
            print(f"  {warning}")
    big = figures[(BACKLOGS[1], clients)]
    # The small backlog's figure is the mean of its point before the large backlog and the one
    # after it: a machine that drifts between the points moves both sides of 100k/1k alike.
    small = (figures[(BACKLOGS[0], clients)].per_second + small_again.per_second) / 2
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"ratios to pgbench (each to the mean of the runs before and after it: in-process "
        f"{in_process_tps:.0f} tps"
        + (f", HTTP {http_tps:.0f} tps" if http is not None else "")
        + "): in-process c16 100k "
        f"{big.per_second / in_process_tps:.3f}x (target 0.25x), "
        f"1k {small / in_process_tps:.3f}x; "
        f"100k/1k {big.per_second / small:.2f} (target 0.90–1.10); "
        f"as {clients} processes: 100k {apart[BACKLOGS[1]].per_second / in_process_tps:.3f}x "
        f"(p99 {apart[BACKLOGS[1]].p99_ms:.1f} ms), "
        f"1k {apart[BACKLOGS[0]].per_second / in_process_tps:.3f}x; "
        + (
            f"HTTP loops {http_per_second / http_tps:.3f}x (target {HTTP_TARGET}x)"
            if http is not None
            else "HTTP loops not measured (--skip-http)"
        )
        + f"; load average {load}"
    )
    print(
        f"claims_per_s_c16_{_label(BACKLOGS[1])}={big.per_second:.1f} "
        f"claims_per_s_c16_{_label(BACKLOGS[0])}={small:.1f} "
        f"claim_p99_ms_c16_{_label(BACKLOGS[1])}={big.p99_ms:.2f} "
        f"http_claim_loops_per_s_c16={http_per_second:.1f} pgbench_tps={sum(runs) / len(runs):.1f}"
    )
    return 0


def _print_point(concurrency: int, result) -> None:
    print(
        f"  c={concurrency:<2} claims/s {result.per_second:8.1f}   p50 {result.p50_ms:7.2f} ms   "
        f"p99 {result.p99_ms:7.2f} ms   ({result.claims} claims, {result.empty} empty; {result.shape})",
        flush=True,
    )


def _pgbench(pgbench: PgBench, seconds: int, clients: int, when: str) -> float:
    tps = pgbench.run(seconds, clients)
    print(f"pgbench TPC-B-like, scale 10, {clients} clients, {seconds}s, {when}: {tps:.1f} tps", flush=True)
    return tps


def _http_loops(http_claims, args: argparse.Namespace, clients: int):
    """The signed-HTTP loops and the CPU each party spent on one (``bench/http_claims.py``)."""
    print(
        f"signed HTTP, manage.py serve (cluster-control), {clients} workers: "
        "offer → starting → running → complete carrying the next claim"
    )
    http = http_claims.measure(args.pg_url, clients=clients, seconds=args.seconds, backlog=args.http_backlog)
    print(
        f"  c={clients} loops/s {http.per_second:8.1f}   p50 {http.p50_ms:7.2f} ms   "
        f"p99 {http.p99_ms:7.2f} ms   "
        f"({http.loops} loops, {http.empty} empty claims; 3 signed calls per loop, "
        f"and a claim for each worker's first; after {http_claims.WARM_UP_SECONDS:g} s of "
        f"{http.warm_up_loops} warm-up loops ({http.warm_up_loops / http_claims.WARM_UP_SECONDS:.0f}/s), "
        "not counted)",
        flush=True,
    )
    per_loop = http.cpu.per_loop_ms(http.loops)
    busy = http.cpu.machine_busy / http.cpu.machine_total if http.cpu.machine_total else 0.0
    print(
        "  CPU per loop: "
        + ", ".join(f"{name} {ms:.2f} ms" for name, ms in per_loop.items())
        + f" = {http.loop_cpu_ms:.2f} ms; machine busy {100 * busy:.0f} %"
        + f" of {os.cpu_count()} cores",
        flush=True,
    )
    return http


if __name__ == "__main__":
    sys.exit(main())
