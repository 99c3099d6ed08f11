"""Claim-path benchmark on PostgreSQL: claims/s and p50/p99 claim latency, next to pgbench.

    .venv/bin/python bench/claim.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_bench

What it measures (docs/protocol.md, Benchmarks: a 100k backlog must cost a claim no more than a small one):

* a backlog of exactly N pending runs (N = 1,000 and 100,000), bulk-loaded with two
  ``INSERT … SELECT generate_series`` statements (runs, then their first attempts) — no
  per-row round trips, no events for the fixture rows;
* C concurrent claimers (C = 1, 4, 16), each a separate OS process with its own database
  connection, its own worker and session (maximum concurrency 1), all started by one barrier;
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
  clients), in its own database ``<bench database>_pgbench``, created and dropped here.

The benchmark database is wiped (every QingLong table truncated) before each backlog: point it at
a database that holds nothing you want. The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pgdb import admin_connect, dbname, ensure_database  # bench/pgdb.py

from actions.enrollment import worker_create
from actions.leases.claims import OfferRequest, lease_claim
from actions.leases.renewal import lease_release
from actions.sessions.registration import session_register
from actions.tasks import task_create
from runs.revisions import RevisionSpec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BACKLOGS = (1_000, 100_000)
CONCURRENCY = (1, 4, 16)


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
    import django

    django.setup()


# --- fixtures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimer:
    worker_id: uuid.UUID
    session_id: uuid.UUID
    generation: int


def reset_and_load(backlog: int, claimers: int) -> list[Claimer]:
    """Truncate every QingLong table, create one task revision, ``claimers`` workers with a live
    session each, and a backlog of exactly ``backlog`` queued runs with their first attempt."""
    from django.db import connection

    from protocol.capabilities import snapshot
    from protocol.ids import uuid7

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE leases_rundispatchlease, runs_runattempt, runs_run, runs_taskrevision, runs_task, "
            "audit_event, workers_workersession, workers_workercredential, workers_enrollmenttoken, "
            "workers_worker CASCADE"
        )
    revision = task_create(
        name="bench-claim",
        spec=RevisionSpec(executor="shell", command="true", timeout_seconds=60),
    )
    capabilities = snapshot(
        {
            "arch": "x86_64",
            "os": "linux",
            "executors": ["shell"],
            "runtimes": [],
            "labels": {"zone": "bench"},
            "memoryMiB": 4096,
            "diskMiB": 20480,
            "cpuCount": 4,
            "gpus": [],
            "features": [],
        }
    )
    out = []
    for index in range(claimers):
        worker = worker_create(name=f"bench-{index:02d}")
        view = session_register(
            worker_id=worker.pk,
            session_id=uuid7(),
            capabilities=capabilities,
            max_concurrent_runs=1,
            available_slots=1,
            software_version="bench/1",
            protocol_version=1,
        )
        out.append(Claimer(worker.pk, view.session.pk, view.session.generation))
    started = time.perf_counter()
    with connection.cursor() as cursor:
        # One statement per table. ready_at is spread over the past hour (FIFO order, older than
        # any dispatch hold); priorities take five levels so pages cross priority boundaries.
        cursor.execute(
            """
            INSERT INTO runs_run (id, task_id, revision_id, state, version, event_sequence,
                                  priority, attempt_count, cancel_reason, error_class, created_by,
                                  created_at)
            SELECT gen_random_uuid(), %(task)s, %(revision)s, 'queued', 1, 1,
                   (g %% 5) - 2, 1, '', '', 'bench',
                   now() - interval '1 hour' + g * interval '1 millisecond'
            FROM generate_series(1, %(n)s) AS g
            """,
            {"task": revision.task_id, "revision": revision.pk, "n": backlog},
        )
        cursor.execute(
            """
            INSERT INTO runs_runattempt (id, run_id, number, state, version, priority, ready_at,
                                         placement_sha256, lease_generation, executor_handle,
                                         outcome_reason, stdout_tail, stderr_tail, created_at)
            SELECT gen_random_uuid(), r.id, 1, 'claimed', 0, r.priority, r.created_at,
                   %(placement)s, 0, '', '', '', '', r.created_at
            FROM runs_run r WHERE r.revision_id = %(revision)s
            """,
            {"revision": revision.pk, "placement": revision.placement_sha256},
        )
        cursor.execute("ANALYZE runs_run")
        cursor.execute("ANALYZE runs_runattempt")
    print(f"  loaded {backlog:,} pending runs in {time.perf_counter() - started:.2f}s", flush=True)
    return out


def queue_plan() -> tuple[str, float, int]:
    """(first plan line, execution ms, shared buffers touched) of what a claim reads: the head of
    one placement class's queue (runs.selectors.placement_class_heads), after finding the classes."""
    from django.db import connection

    from core.db import db_now
    from runs.selectors import QUEUE_PAGE, dispatch_queue_queryset, waiting_placement_classes

    now = db_now()
    classes = waiting_placement_classes()
    head = dispatch_queue_queryset(now=now).filter(placement_sha256=classes[0])[:QUEUE_PAGE]
    sql, params = head.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) " + sql, params)
        lines = [row[0] for row in cursor.fetchall()]
    scan = next((line.strip() for line in lines if "Index" in line and "attempt" in line), lines[0].strip())
    execution = float(re.search(r"Execution Time: ([\d.]+)", "\n".join(lines)).group(1))
    top = next((line for line in lines if line.strip().startswith("Buffers:")), "")  # the whole plan's
    buffers = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))
    return scan, execution, buffers


# --- the measurement -----------------------------------------------------------------------------


def _claimer(claimer: Claimer, barrier, seconds: float, results) -> None:
    from django.db import connection

    from protocol.ids import uuid7

    latencies: list[float] = []
    empty = 0
    try:
        barrier.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            token = secrets.token_urlsafe(32)
            started = time.perf_counter()
            offers = lease_claim(
                worker_id=claimer.worker_id,
                session_id=claimer.session_id,
                generation=claimer.generation,
                offers=[OfferRequest(uuid7(), token)],
            )
            latencies.append(time.perf_counter() - started)
            if not offers:
                empty += 1
                continue
            lease = offers[0].lease
            lease_release(
                worker_id=claimer.worker_id,
                session_id=claimer.session_id,
                generation=claimer.generation,
                attempt_id=lease.attempt_id,
                lease_generation=lease.lease_generation,
                lease_token=token,
                lease_version=lease.version,
            )
        results.put((latencies, empty, None))
    except Exception as exc:  # report, do not hang the parent
        results.put(([], 0, f"{type(exc).__name__}: {exc}"))
    finally:
        connection.close()


@dataclass(frozen=True)
class Figures:
    claims: int
    empty: int
    wall_seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def per_second(self) -> float:
        return self.claims / self.wall_seconds


def measure(claimers: list[Claimer], seconds: float) -> Figures:
    from django.db import connections

    connections.close_all()  # children must open their own connections
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(claimers) + 1)
    results = context.Queue()
    processes = [context.Process(target=_claimer, args=(c, barrier, seconds, results)) for c in claimers]
    for process in processes:
        process.start()
    barrier.wait()
    started = time.perf_counter()
    collected = [results.get(timeout=seconds + 120) for _ in processes]
    wall = time.perf_counter() - started
    for process in processes:
        process.join(30)
    errors = [error for _, _, error in collected if error]
    if errors:
        raise SystemExit(f"a claimer failed: {errors[0]}")
    latencies = sorted(x for latencies, _, _ in collected for x in latencies)
    empty = sum(e for _, e, _ in collected)
    claims = len(latencies) - empty
    if claims == 0:
        raise SystemExit("no claim succeeded")
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
    return Figures(claims, empty, wall, statistics.median(latencies) * 1000, p99 * 1000)


# --- pgbench -------------------------------------------------------------------------------------


def pgbench_tps(url: str, seconds: int, clients: int) -> float:
    from psycopg import sql

    if shutil.which("pgbench") is None:
        raise SystemExit("pgbench is not installed (apt-get install postgresql-client)")
    name = dbname(url) + "_pgbench"
    parts = urlsplit(url)
    env = {
        **os.environ,
        "PGHOST": parts.hostname or "127.0.0.1",
        "PGPORT": str(parts.port or 5432),
        "PGUSER": parts.username or "postgres",
    }
    if parts.password:
        env["PGPASSWORD"] = parts.password
    with admin_connect(url) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        subprocess.run(["pgbench", "-i", "-q", "-s", "10", name], env=env, check=True, capture_output=True)
        done = subprocess.run(
            ["pgbench", "-c", str(clients), "-j", str(clients), "-T", str(seconds), name],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        with admin_connect(url) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
    if match is None:
        raise SystemExit(f"could not read pgbench's tps from:\n{done.stdout}")
    return float(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg-url", required=True, help="benchmark database (wiped), e.g. postgres://…/qinglong_bench"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement per (backlog, concurrency)")
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    args = parser.parse_args()
    if not args.pg_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("the claim benchmark runs on PostgreSQL only")

    ensure_database(args.pg_url)
    setup_django(args.pg_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print(
        f"claim benchmark on {urlsplit(args.pg_url).hostname}/{dbname(args.pg_url)}: "
        f"{args.seconds:g}s per point, claim (timed) → release (untimed) per loop, {os.cpu_count()} CPUs"
    )
    figures: dict[tuple[int, int], Figures] = {}
    for backlog in BACKLOGS:
        print(f"backlog {backlog:,} pending runs", flush=True)
        claimers = reset_and_load(backlog, max(CONCURRENCY))
        scan, execution_ms, buffers = queue_plan()
        print(f"  queue page plan: {scan}")
        print(f"  queue page: {execution_ms:.3f} ms, {buffers} shared buffers")
        for concurrency in CONCURRENCY:
            result = measure(claimers[:concurrency], args.seconds)
            figures[(backlog, concurrency)] = result
            print(
                f"  c={concurrency:<2} claims/s {result.per_second:8.1f}   p50 {result.p50_ms:7.2f} ms   "
                f"p99 {result.p99_ms:7.2f} ms   ({result.claims} claims, {result.empty} empty)",
                flush=True,
            )
    tps = pgbench_tps(args.pg_url, args.pgbench_seconds, max(CONCURRENCY))
    print(f"pgbench TPC-B-like, scale 10, {max(CONCURRENCY)} clients, {args.pgbench_seconds}s: {tps:.1f} tps")
    big, small = figures[(BACKLOGS[1], 16)], figures[(BACKLOGS[0], 16)]
    print(
        f"claims_per_s_c16_{_label(BACKLOGS[1])}={big.per_second:.1f} "
        f"claim_p99_ms_c16_{_label(BACKLOGS[1])}={big.p99_ms:.2f} "
        f"claims_per_s_c16_{_label(BACKLOGS[0])}={small.per_second:.1f} pgbench_tps={tps:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
