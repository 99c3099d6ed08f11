"""The half of the claim benchmark (bench/claim.py) that imports Django models: the fixtures, the
claimer processes and the queue plan. bench/claim.py imports it once ``django.setup()`` has run.
"""

from __future__ import annotations

import multiprocessing
import re
import secrets
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection, connections

from actions.enrollment import worker_create
from actions.leases.claims import OfferRequest, lease_claim
from actions.leases.renewal import lease_release
from actions.sessions.registration import session_register
from actions.tasks import task_create
from core.db import db_now
from protocol.capabilities import snapshot
from protocol.ids import uuid7
from runs.revisions import RevisionSpec
from runs.selectors import QUEUE_PAGE, dispatch_queue_queryset, waiting_placement_classes

# --- fixtures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimer:
    worker_id: uuid.UUID
    session_id: uuid.UUID
    generation: int


def wipe() -> None:
    """Truncate every QingLong table the claim benchmarks fill."""
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE leases_rundispatchlease, runs_runattempt, runs_run, runs_taskrevision, runs_task, "
            "audit_event, workers_workersession, workers_workercredential, workers_enrollmenttoken, "
            "workers_worker CASCADE"
        )


def reset_and_load(backlog: int, claimers: int) -> list[Claimer]:
    """Truncate every QingLong table, create one task revision, ``claimers`` workers with a live
    session each, and a backlog of exactly ``backlog`` queued runs with their first attempt."""
    wipe()
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
        # Vacuumed as well as analysed: a bulk load this size sets off autovacuum, which would
        # otherwise scan both tables during the first measurements (steady state is measured).
        cursor.execute("VACUUM (ANALYZE) runs_run, runs_runattempt")
    print(f"  loaded {backlog:,} pending runs in {time.perf_counter() - started:.2f}s", flush=True)
    return out


def queue_plan() -> tuple[str, float, int]:
    """(first plan line, execution ms, shared buffers touched) of what a claim reads: the head of
    one placement class's queue (runs.selectors.placement_class_heads), after finding the classes."""
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


def claim_once(claimer: Claimer) -> tuple[Any, str] | None:
    """One ``lease_claim`` of one offer for ``claimer``: (the lease, its token), or None if empty."""
    token = secrets.token_urlsafe(32)
    offers = lease_claim(
        worker_id=claimer.worker_id,
        session_id=claimer.session_id,
        generation=claimer.generation,
        offers=[OfferRequest(uuid7(), token)],
    )
    return (offers[0].lease, token) if offers else None


def release(claimer: Claimer, lease: Any, token: str) -> None:
    """``lease_release`` of a lease :func:`claim_once` took (back to the queue)."""
    lease_release(
        worker_id=claimer.worker_id,
        session_id=claimer.session_id,
        generation=claimer.generation,
        attempt_id=lease.attempt_id,
        lease_generation=lease.lease_generation,
        lease_token=token,
        lease_version=lease.version,
    )


def _claimer(claimer: Claimer, barrier, seconds: float, results) -> None:
    latencies: list[float] = []
    empty = 0
    try:
        barrier.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            claimed = claim_once(claimer)
            latencies.append(time.perf_counter() - started)
            if claimed is None:
                empty += 1
                continue
            release(claimer, *claimed)
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
    #: How the claimers ran: "2 processes × 8 threads", "16 processes".
    shape: str

    @property
    def per_second(self) -> float:
        return self.claims / self.wall_seconds


#: The tables a claim → release loop churns (non-HOT lease updates leave a dead row version and
#: index entries per release).
CHURNED = "leases_rundispatchlease, runs_runattempt, runs_run, workers_worker, workers_workersession"


def vacuum_churned() -> None:
    """``VACUUM`` the tables the loops churn, before a window: what autovacuum does between windows
    on a server that runs it. This machine's server has ``autovacuum = off`` (its CI configuration),
    so without this every window would start on the dead rows of all the windows before it, while
    ``pgbench`` vacuums its own tables before each run (docs/performance.md, "Method")."""
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {CHURNED}")


def _shape(groups: list[list[Claimer]]) -> str:
    sizes = sorted({len(group) for group in groups}, reverse=True)
    threads = "" if sizes == [1] else f" × {'/'.join(map(str, sizes))} threads"
    return f"{len(groups)} process{'es' if len(groups) > 1 else ''}{threads}"


def _process(group: list[Claimer], barrier, seconds: float, results) -> None:
    """One claimer process: its first claimer on this thread, the others on threads of their own,
    as ``manage.py serve`` runs its claims on the request threads of each server process."""
    threads = [threading.Thread(target=_claimer, args=(c, barrier, seconds, results)) for c in group[1:]]
    for thread in threads:
        thread.start()
    _claimer(group[0], barrier, seconds, results)
    for thread in threads:
        thread.join()


def measure(claimers: list[Claimer], seconds: float, *, processes: int | None = None) -> Figures:
    """Run every claimer's claim → release loop for ``seconds`` at once and sum them up.

    ``processes``: how many OS processes share the claimers (each runs its share on threads, one
    connection per thread); ``None`` gives each claimer a process of its own. Raises SystemExit
    when a claimer failed or nothing was claimed."""
    vacuum_churned()
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")  # as bench/pgdb.checkpoint: no timed checkpoint in the window
    connections.close_all()  # children must open their own connections
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(claimers) + 1)
    results = context.Queue()
    count = len(claimers) if processes is None else min(processes, len(claimers))
    groups = [claimers[i::count] for i in range(count)]
    children = [context.Process(target=_process, args=(g, barrier, seconds, results)) for g in groups]
    for child in children:
        child.start()
    try:
        barrier.wait(timeout=120)  # a child that died before it would otherwise hang the run
    except threading.BrokenBarrierError:
        for child in children:
            child.kill()
        raise SystemExit("the claimer processes did not all start within 120 s") from None
    started = time.perf_counter()
    collected = [results.get(timeout=seconds + 120) for _ in claimers]
    wall = time.perf_counter() - started
    for child in children:
        child.join(30)
    errors = [error for _, _, error in collected if error]
    if errors:
        raise SystemExit(f"a claimer failed: {errors[0]}")
    latencies = sorted(x for latencies, _, _ in collected for x in latencies)
    empty = sum(e for _, e, _ in collected)
    claims = len(latencies) - empty
    if claims == 0:
        raise SystemExit("no claim succeeded")
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
    return Figures(claims, empty, wall, statistics.median(latencies) * 1000, p99 * 1000, _shape(groups))
