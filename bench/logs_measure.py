"""The half of the log benchmark (bench/logs.py) that imports Django models: the running attempts,
the logger processes and the CPU they take. bench/logs.py imports it once ``django.setup()`` ran."""

from __future__ import annotations

import os
import random
import secrets
import time
from collections.abc import Callable

import claim_measure  # bench/claim_measure.py
from cpu import machine_busy  # bench/cpu.py
from django.db import connection
from django.test.utils import CaptureQueriesContext

from actions.leases.activation import lease_running, lease_starting
from actions.leases.claims import OfferRequest, lease_claim
from actions.logs import Chunk, Segment, log_append
from protocol.ids import uuid7

CHUNK = 32 * 1024
_WORDS = (
    "compiling linking fetched step ok processed items warning: cache hit miss test passed module "
    "src/core/db.py in ms"
).split()
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN")


def sample_output(size: int, rng: random.Random) -> bytes:
    """``size`` bytes of job-like output lines (timestamps, levels, words, hex ids, counters),
    ending with a newline: about 3× compressible, like a build or test log (one repeated byte
    would compress to nothing and hide what the rows cost)."""
    out = bytearray()
    while len(out) < size:
        out += (
            f"2026-12-01T14:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d}Z "
            f"{rng.choice(_LEVELS)} {' '.join(rng.choices(_WORDS, k=rng.randint(3, 9)))} "
            f"id={rng.getrandbits(48):012x} n={rng.randrange(10**5)}\n"
        ).encode()
    return bytes(out[: size - 1]) + b"\n"


class Chunks:
    """Full chunks (32 KiB: a stdout and a stderr segment of 16 KiB) of job-like output for one
    attempt, numbered from 1, cycling through a few distinct contents."""

    def __init__(self, seed: int, distinct: int = 8) -> None:
        rng = random.Random(seed)
        self.halves = [sample_output(CHUNK // 2, rng) for _ in range(distinct)]

    def chunk(self, seq: int) -> Chunk:
        half = self.halves[seq % len(self.halves)]
        offset = (seq - 1) * len(half)
        return Chunk(seq, (Segment("stdout", offset, half), Segment("stderr", offset, half)))


def start_attempt(worker) -> dict:
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


def backend_cpu() -> Callable[[], float | None]:
    """A reader of the CPU seconds (user + system) this connection's PostgreSQL backend has used
    so far, from ``/proc`` (the server on this machine); it returns None when it cannot read them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    ticks = os.sysconf("SC_CLK_TCK")

    def read() -> float | None:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime

    return read


def profile_append(lease: dict, appends: int = 200) -> dict:
    """One attempt's appends of full chunks in this process: the statements of the first append
    and of a later one, then ``appends`` more timed without query capture (capture formats every
    statement): wall, Python CPU and the backend's CPU per append (ms)."""
    chunks = Chunks(seed=7)
    with CaptureQueriesContext(connection) as captured:
        log_append(**lease, chunk=chunks.chunk(1))
    first = [q for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    with CaptureQueriesContext(connection) as captured:
        log_append(**lease, chunk=chunks.chunk(2))
    later = list(captured.captured_queries)
    backend = backend_cpu()
    started, started_cpu, started_backend = time.perf_counter(), time.process_time(), backend()
    for seq in range(3, appends + 3):
        log_append(**lease, chunk=chunks.chunk(seq))
    wall = time.perf_counter() - started
    cpu = time.process_time() - started_cpu
    ended_backend = backend()
    server = (
        (ended_backend - started_backend) / appends * 1000
        if started_backend is not None and ended_backend is not None
        else None
    )
    return {
        "statements_first": len(first),
        "statements": len([q for q in later if q["sql"] not in ("BEGIN", "COMMIT")]),
        "sql": [q["sql"][:70] for q in later],
        "wall_ms": wall / appends * 1000,
        "cpu_ms": cpu / appends * 1000,
        "backend_cpu_ms": server,
    }


def logger(lease: dict, seed: int, barrier, seconds: float, pace: float | None, results) -> None:
    """Append full chunks to ``lease``'s attempt for ``seconds`` (one per ``pace`` seconds, or as
    fast as they are taken); report (bytes, wall s, own CPU s, backend CPU s or None, error)."""
    chunks = Chunks(seed)
    sent = 0
    try:
        backend = backend_cpu()
        barrier.wait()
        started, started_cpu, started_backend = time.perf_counter(), time.process_time(), backend()
        deadline = started + seconds
        seq = 0
        while time.perf_counter() < deadline:
            seq += 1
            chunk = chunks.chunk(seq)
            log_append(**lease, chunk=chunk)
            sent += chunk.size
            if pace is not None:
                time.sleep(max(0.0, started + seq * pace - time.perf_counter()))
        wall, cpu, ended_backend = time.perf_counter() - started, time.process_time() - started_cpu, backend()
        server = ended_backend - started_backend if None not in (started_backend, ended_backend) else None
        results.put((sent, wall, cpu, server, None))
    except Exception as exc:  # report, do not hang the parent
        results.put((sent, 0.0, 0.0, None, f"{type(exc).__name__}: {exc}"))
    finally:
        connection.close()


def run_loggers(leases: list[dict], seconds: float, pace: float | None, context):
    """Start one logger process per lease; returns (barrier, results, processes) once started."""
    barrier = context.Barrier(len(leases) + 1)
    results = context.Queue()
    processes = [
        context.Process(target=logger, args=(lease, index, barrier, seconds, pace, results))
        for index, lease in enumerate(leases)
    ]
    for process in processes:
        process.start()
    return barrier, results, processes


def collect(results, processes, seconds: float) -> list[tuple[int, float, float, float | None]]:
    """Each logger's (bytes sent, wall s, own CPU s, its backend's CPU s or None)."""
    got = [results.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(30)
    errors = [error for *_, error in got if error]
    if errors:
        raise SystemExit(f"a logger failed: {errors[0]}")
    return [(sent, wall, cpu, server) for sent, wall, cpu, server, _ in got]


# --- claims/s with and without logging, in alternating windows of one run -------------------------
#
# The machine is shared: its load moves by 2x within a minute, so two separate 10 s runs (quiet,
# then logging) mostly measure the drift. Here the claimers run for the whole measurement and
# stamp every claim; the loggers log only in the "on" windows, in the order off, on, on, off
# (repeated), so that a steady drift of the machine's load weighs on both sides alike; the claims
# are counted per window.

#: Windows off (False) and on (True): ABBA, so a linear drift cancels.
PATTERN = (False, True, True, False)


def window_on(index: int) -> bool:
    return PATTERN[index % len(PATTERN)]


def stamping_claimer(claimer, barrier, seconds: float, results) -> None:
    """Claim -> release loops (bench/claim.py's) for ``seconds`` after the barrier; report the
    time of each claim that got an attempt (``perf_counter``, relative to the barrier)."""
    stamps: list[float] = []
    try:
        barrier.wait()
        started = time.perf_counter()
        while (now := time.perf_counter()) < started + seconds:
            claimed = claim_measure.claim_once(claimer)
            if claimed is None:
                continue
            stamps.append(now - started)
            claim_measure.release(claimer, *claimed)
        results.put(("claimer", stamps, None))
    except Exception as exc:  # report, do not hang the parent
        results.put(("claimer", [], f"{type(exc).__name__}: {exc}"))
    finally:
        connection.close()


def window_logger(
    lease: dict, index: int, loggers: int, barrier, windows: int, window: float, pace: float, results
) -> None:
    """One full chunk every ``pace`` seconds (phase-shifted by ``index``/``loggers`` of it, as
    agents are not in step), sent only inside the "on" windows; reports (bytes, own CPU s,
    backend CPU s or None)."""
    chunks = Chunks(index)
    sent = seq = 0
    try:
        backend = backend_cpu()
        barrier.wait()
        started, started_cpu, started_backend = time.perf_counter(), time.process_time(), backend()
        tick = 0
        while (at := index / loggers * pace + tick * pace) < windows * window:
            tick += 1
            time.sleep(max(0.0, started + at - time.perf_counter()))
            if not window_on(int(at // window)):
                continue
            seq += 1
            chunk = chunks.chunk(seq)
            log_append(**lease, chunk=chunk)
            sent += chunk.size
        cpu, ended_backend = time.process_time() - started_cpu, backend()
        server = ended_backend - started_backend if None not in (started_backend, ended_backend) else None
        results.put(("logger", (sent, cpu, server), None))
    except Exception as exc:  # report, do not hang the parent
        results.put(("logger", (sent, 0.0, None), f"{type(exc).__name__}: {exc}"))
    finally:
        connection.close()


def alternating(
    claimers: list, leases: list[dict], windows: int, window: float, pace: float, context
) -> dict:
    """Claims/s in the windows without and with the loggers logging, and what the loggers took.

    Returns ``quiet`` and ``logging`` (claims/s over those windows), ``per_window`` (claims/s of
    each window, in order, with whether it was on), ``logged_bytes``, ``logger_cpu`` and
    ``backend_cpu`` (CPU seconds in all; the latter None if /proc could not be read),
    ``on_seconds`` and the machine's busy share in the off and on windows."""
    seconds = windows * window
    barrier = context.Barrier(len(claimers) + len(leases) + 1)
    results = context.Queue()
    processes = [
        context.Process(target=stamping_claimer, args=(claimer, barrier, seconds, results))
        for claimer in claimers
    ] + [
        context.Process(
            target=window_logger, args=(lease, index, len(leases), barrier, windows, window, pace, results)
        )
        for index, lease in enumerate(leases)
    ]
    for process in processes:
        process.start()
    barrier.wait()
    started = time.perf_counter()
    busy: list[tuple[float, float]] = []
    for index in range(windows + 1):  # the machine's CPU at each window boundary
        time.sleep(max(0.0, started + index * window - time.perf_counter()))
        busy.append(machine_busy())
    got = [results.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(30)
    errors = [error for _, _, error in got if error]
    if errors:
        raise SystemExit(f"a claimer or logger failed: {errors[0]}")
    counts = [0] * windows
    for kind, stamps, _ in got:
        if kind == "claimer":
            for stamp in stamps:
                counts[min(windows - 1, int(stamp // window))] += 1
    logged = [figures for kind, figures, _ in got if kind == "logger"]
    on = [window_on(index) for index in range(windows)]
    on_seconds = sum(on) * window
    off_seconds = seconds - on_seconds

    def busy_share(which: bool) -> float:
        spent = sum(busy[i + 1][0] - busy[i][0] for i in range(windows) if on[i] == which)
        total = sum(busy[i + 1][1] - busy[i][1] for i in range(windows) if on[i] == which)
        return spent / total if total else 0.0

    servers = [server for _, _, server in logged]
    return {
        "quiet": sum(c for c, o in zip(counts, on, strict=True) if not o) / off_seconds,
        "logging": sum(c for c, o in zip(counts, on, strict=True) if o) / on_seconds,
        "per_window": [(count / window, o) for count, o in zip(counts, on, strict=True)],
        "logged_bytes": sum(sent for sent, _, _ in logged),
        "logger_cpu": sum(cpu for _, cpu, _ in logged),
        "backend_cpu": None if None in servers else sum(s for s in servers if s is not None),
        "on_seconds": on_seconds,
        "busy_quiet": busy_share(False),
        "busy_logging": busy_share(True),
    }
