"""`make bench-heartbeat`: heartbeats per second through the real HTTP API, and PostgreSQL WAL bytes
per unchanged heartbeat next to the WAL bytes of a naive row update, measured in the same run.

Usage::

    .venv/bin/python bench/heartbeat.py --pg-url postgres://postgres@127.0.0.1:5432/qinglong_bench \\
        [--heartbeats 3000] [--clients 8] [--wal-heartbeats 400] [--profile cluster-control]

What it does, against the PostgreSQL database it is given (it migrates it; use one of your own):

1. starts a real control plane, ``manage.py serve`` (Granian, ``SERVER_PROCESSES`` server
   processes of 8 request slots, no sweep loop), on a free port between 8300 and 8399, with the
   chosen profile's timings (cluster-control: Redis at ``REDIS_URL`` for nonces and rate limits)
   and the worker rate limit lifted;
2. enrolls ``--clients`` workers over HTTP and registers a session for each, signing every
   request exactly as the agent does (``agent.client``);
3. **throughput**: the clients send ``--heartbeats`` unchanged heartbeats between them, as fast
   as they can, each on its own keep-alive connection → heartbeats/s and latency percentiles;
4. **WAL per unchanged heartbeat**: one client sends ``--wal-heartbeats`` unchanged heartbeats
   at the profile's cadence. Time is not slept: before each heartbeat the session's lease expiry
   is moved back by the jittered interval the previous answer announced (``nextHeartbeatAt -
   serverTime``), exactly as if that much time had passed, so the write rule (extend only past
   half the lease) fires as often as it would in production. ``pg_current_wal_lsn()`` is read
   right before and right after each heartbeat; the move itself falls outside the windows;
5. **naive update**: the same number of single-row updates of the session's lease expiry
   (``UPDATE … SET lease_expires_at = statement_timestamp() + ttl``, autocommit) — what a
   heartbeat costs when it writes every time — measured with the same windows; and, as a
   reference, as many HOT updates of the same row (no indexed column changed).

The PostgreSQL cluster may be shared (other databases write WAL at the same time), so the WAL
inside each window is also read back with ``pg_walinspect`` (created in the given database if
missing) and only records of this database — pages of its relations, and the commit records of
transactions that wrote them — are counted. That attributed figure is what the last line reports;
the raw LSN deltas are printed beside it. Without ``pg_walinspect`` the raw deltas are reported.
Pruning records (``Heap2``/``PRUNE``: a page's dead row versions removed on a later access) are
left out on both sides: the simulated passing of time is a row update of its own before every
heartbeat, whose pruning would otherwise land in the next heartbeat's window (about 10 B a pure
read) though production has no such update; a naive update, which leaves a dead version on every
call, gives up its pruning alike (which favours the naive side).

The last line is machine-readable::

    heartbeats_per_s=<n> pgbench_tps=<n> wal_bytes_per_unchanged_heartbeat=<n> wal_bytes_naive_update=<n>

``pgbench_tps`` is pgbench's TPC-B-like script (scale 10, 16 clients) on the same server in the
same run (``bench/pgdb.py``), so that the heartbeat rate can be read as a ratio: the mean of a run
before the server starts and one after the WAL measurement (``--pgbench-seconds`` each), which
bracket the heartbeats (``pgdb.PgBench``; the WAL is measured before the second run's
``CHECKPOINT``, as before).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import django
import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pgdb import PgBench, ensure_database  # noqa: E402  (bench/pgdb.py)

from agent.client import ApiError, Client, TransportError  # noqa: E402
from core.conf import protocol  # noqa: E402  (settings are read when called, after configure_django)
from protocol import wire  # noqa: E402
from protocol.ids import uuid7  # noqa: E402
from protocol.signing import public_key_text  # noqa: E402

PORTS = range(8300, 8400)
SNAPSHOT = {
    "arch": "x86_64",
    "os": "linux",
    "executors": ["shell"],
    "runtimes": [{"name": "bash", "version": "5.2.15"}],
    "labels": {"zone": "bench"},
    "memoryMiB": 4096,
    "diskMiB": 20480,
    "cpuCount": 4,
    "gpus": [],
    "features": [],
}


def say(message: str) -> None:
    print(f"[bench-heartbeat] {message}", flush=True)


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit("no free port between 8300 and 8399")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- setup -----------------------------------------------------------------------------------------


def configure_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")
    django.setup()
    call_command("migrate", verbosity=0)


#: Server processes, as deployed (``QINGLONG_SERVER_PROCESSES`` in deploy/qinglong.env.example: one
#: per core of the 2-core reference machine); the environment variable overrides it.
SERVER_PROCESSES = int(os.environ.get("QINGLONG_SERVER_PROCESSES", "2"))


def start_server(env: dict[str, str], port: int) -> subprocess.Popen:
    """``manage.py serve`` in the background (``SERVER_PROCESSES`` server processes, 8 request slots
    each, no sweep loop); its output goes to ``$QINGLONG_VAR_DIR/serve.log``."""
    log_path = Path(env["QINGLONG_VAR_DIR"]) / "serve.log"
    with log_path.open("wb") as log_file:
        server = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--threads",
                "8",
                "--workers",
                str(SERVER_PROCESSES),
                "--no-sweep",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(
                f"manage.py serve exited with {server.returncode}:\n{log_path.read_text()[-2000:]}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.2)
    server.terminate()
    raise SystemExit("manage.py serve did not start within 60 s")


@dataclass
class BenchWorker:
    client: Client
    session_id: str = ""
    generation: int = 0
    version: int = 0
    latencies: list[float] = field(default_factory=list)
    #: The offer the last completion's next claim brought (answer, lease token, offer id), for
    #: bench-claim's loops (bench/http_claims.py); None when the next attempt needs a claim.
    next_offer: tuple[dict, str, str] | None = None

    def fence(self) -> dict:
        return {"sessionId": self.session_id, "generation": self.generation}

    def heartbeat(self) -> dict:
        body = {**self.fence(), "expectedVersion": self.version, "availableSlots": 1}
        try:
            answer = self.client.post(wire.SESSION_HEARTBEAT, body)
        except (
            TransportError
        ):  # the server closed an idle keep-alive connection: once more, as the agent does
            answer = self.client.post(wire.SESSION_HEARTBEAT, body)
        self.version = answer["version"]
        return answer


def enroll_workers(server_url: str, tokens: list[str]) -> list[BenchWorker]:
    """Enroll one worker per enrollment token and register a session for each, over HTTP."""
    workers = []
    for token in tokens:
        key = Ed25519PrivateKey.generate()
        enrolled = Client(server_url).post(
            wire.ENROLL, {"token": token, "publicKey": public_key_text(key.public_key())}, signed=False
        )
        client = Client(server_url, key_id=enrolled["credentialId"], key=key)
        answer = client.post(
            wire.SESSION_REGISTER,
            {
                "sessionId": str(uuid7()),
                "capabilities": SNAPSHOT,
                "maxConcurrentRuns": 1,
                "availableSlots": 1,
                "softwareVersion": "bench/1",
                "protocolVersion": 1,
            },
        )
        workers.append(BenchWorker(client, answer["sessionId"], answer["generation"], answer["version"]))
    return workers


# --- WAL accounting --------------------------------------------------------------------------------


class Wal:
    """``pg_current_wal_lsn()`` windows, and the bytes in them that belong to this database."""

    def __init__(self, conninfo: str) -> None:
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.dboid = self.conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()[0]
        self.inspect = True
        try:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        except psycopg.Error as exc:
            say(f"pg_walinspect unavailable ({exc.diag.message_primary}); reporting raw LSN deltas")
            self.inspect = False
        self.ours = re.compile(rf"rel \d+/{self.dboid}/\d+")

    def lsn(self) -> str:
        return self.conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]

    def raw(self, start: str, end: str) -> int:
        return int(self.conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", [end, start]).fetchone()[0])

    def attributed(self, windows: list[tuple[str, str]]) -> list[int]:
        """Per window: bytes of WAL records of this database (its pages, its transactions' commits)."""
        last = max(end for _, end in windows)
        for _ in range(100):  # the records must be flushed before they can be read back
            if self.raw(last, self.conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]) >= 0:
                break
            time.sleep(0.05)
        totals = []
        for start, end in windows:
            if self.raw(start, end) <= 0:
                totals.append(0)
                continue
            records = self.conn.execute(
                "SELECT xid::text::bigint, record_length, coalesce(block_ref, '') "
                "FROM pg_get_wal_records_info(%s, %s)"
                " WHERE NOT (resource_manager = 'Heap2' AND record_type LIKE 'PRUNE%%')",
                [start, end],
            ).fetchall()
            xids = {xid for xid, _, refs in records if xid and self.ours.search(refs)}
            totals.append(
                sum(length for xid, length, refs in records if self.ours.search(refs) or xid in xids)
            )
        return totals


@dataclass
class Windows:
    spans: list[tuple[str, str]] = field(default_factory=list)
    wrote: list[bool] = field(default_factory=list)

    def summary(self, wal: Wal) -> tuple[list[int], list[int]]:
        raw = [wal.raw(start, end) for start, end in self.spans]
        return raw, (wal.attributed(self.spans) if wal.inspect else raw)


# --- the three measurements ------------------------------------------------------------------------


def throughput(workers: list[BenchWorker], total: int) -> tuple[float, list[float]]:
    per_client = max(1, total // len(workers))
    start = threading.Barrier(len(workers) + 1)
    errors: list[str] = []

    def run(worker: BenchWorker) -> None:
        worker.heartbeat()  # warm the connection and the credential cache
        start.wait()
        for _ in range(per_client):
            began = time.perf_counter()
            try:
                worker.heartbeat()
            except ApiError as exc:
                errors.append(str(exc))
            worker.latencies.append(time.perf_counter() - began)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise SystemExit(f"{len(errors)} heartbeats failed, first: {errors[0]}")
    latencies = sorted(lat for w in workers for lat in w.latencies)
    return per_client * len(workers) / elapsed, latencies


def wal_per_heartbeat(worker: BenchWorker, wal: Wal, count: int) -> Windows:
    windows = Windows()
    answer = worker.heartbeat()
    for _ in range(count):
        elapsed = (parse_time(answer["nextHeartbeatAt"]) - parse_time(answer["serverTime"])).total_seconds()
        wal.conn.execute(  # that much time passes (outside the measured window)
            "UPDATE workers_workersession"
            " SET lease_expires_at = lease_expires_at - make_interval(secs => %s) WHERE id = %s",
            [elapsed, worker.session_id],
        )
        shifted_expiry = parse_time(answer["leaseExpiresAt"]) - timedelta(seconds=elapsed)
        start = wal.lsn()
        answer = worker.heartbeat()
        windows.spans.append((start, wal.lsn()))
        # the lease was extended when it now ends later than where the simulated time left it
        windows.wrote.append(
            parse_time(answer["leaseExpiresAt"]) - shifted_expiry > timedelta(milliseconds=1)
        )
    return windows


def wal_naive_update(worker: BenchWorker, wal: Wal, count: int, ttl: int) -> Windows:
    windows = Windows()
    for _ in range(count):
        start = wal.lsn()
        wal.conn.execute(
            "UPDATE workers_workersession"
            " SET lease_expires_at = statement_timestamp() + make_interval(secs => %s) WHERE id = %s",
            [ttl, worker.session_id],
        )
        windows.spans.append((start, wal.lsn()))
        windows.wrote.append(True)
    return windows


def wal_hot_update(worker: BenchWorker, wal: Wal, count: int) -> Windows:
    """A reference: the same row rewritten without touching an indexed column (a HOT update)."""
    windows = Windows()
    for _ in range(count):
        start = wal.lsn()
        wal.conn.execute(
            "UPDATE workers_workersession SET available_slots = available_slots WHERE id = %s",
            [worker.session_id],
        )
        windows.spans.append((start, wal.lsn()))
        windows.wrote.append(True)
    return windows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/qinglong")
    )
    parser.add_argument(
        "--heartbeats", type=int, default=3000, help="unchanged heartbeats for the throughput"
    )
    parser.add_argument("--clients", type=int, default=8, help="workers sending heartbeats at once")
    parser.add_argument("--wal-heartbeats", type=int, default=400, help="heartbeats in the WAL measurement")
    parser.add_argument("--profile", choices=["standalone", "cluster-control"], default="cluster-control")
    parser.add_argument(
        "--pgbench-seconds", type=int, default=6, help="each of the two pgbench runs around the heartbeats"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="serve here (default: the first free of 8300-8399)"
    )
    args = parser.parse_args()
    ensure_database(args.pg_url)

    var = tempfile.mkdtemp(prefix="qinglong-bench-")
    env = {
        "DATABASE_URL": args.pg_url,
        "QINGLONG_PROFILE": args.profile,
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", secrets.token_urlsafe(40)),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        "QINGLONG_VAR_DIR": var,
        "QINGLONG_RATE_WORKER": "100000000/m",
        "QINGLONG_RATE_ENROLL": "10000/m",
        "QINGLONG_LOG_LEVEL": "WARNING",
    }
    configure_django(env)
    timings = protocol()
    with PgBench(args.pg_url) as pgbench:
        before = pgbench.run(args.pgbench_seconds, 16)
        say(
            f"pgbench TPC-B-like, scale 10, 16 clients, {args.pgbench_seconds}s, "
            f"before the heartbeats: {before:.1f} tps"
        )
        return _measure(args, env, timings, pgbench)


def _measure(args: argparse.Namespace, env: dict[str, str], timings, pgbench: PgBench) -> int:
    """Serve, enroll, time the heartbeats and their WAL, run pgbench again; print the figures."""
    import heartbeat_tokens  # noqa: PLC0415  (it imports Django models: only after django.setup())

    port = args.port or free_port()
    server = start_server(env, port)
    try:
        url = f"http://127.0.0.1:{port}"
        say(
            f"manage.py serve on {url}, profile {args.profile}, "
            f"session lease {timings.session_lease_seconds} s, "
            f"heartbeat {timings.heartbeat_interval_seconds} s ± {timings.heartbeat_jitter_ratio:.0%}"
        )
        workers = enroll_workers(url, heartbeat_tokens.issue_tokens(args.clients, secrets.token_hex(3)))
        rate, latencies = throughput(workers, args.heartbeats)
        p50 = statistics.median(latencies) * 1000
        # the rank claim_measure, http_claims and dispatch take
        p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))] * 1000
        say(
            f"throughput: {len(latencies)} unchanged heartbeats from {args.clients} workers "
            f"over signed HTTP: {rate:.0f} heartbeats/s (latency p50 {p50:.1f} ms, p99 {p99:.1f} ms)"
        )

        wal = Wal(args.pg_url.replace("postgres://", "postgresql://", 1))
        beats = wal_per_heartbeat(workers[0], wal, args.wal_heartbeats)
        naive = wal_naive_update(workers[0], wal, args.wal_heartbeats, timings.session_lease_seconds)
        hot = wal_hot_update(workers[0], wal, args.wal_heartbeats)
        beat_raw, beat_ours = beats.summary(wal)
        naive_raw, naive_ours = naive.summary(wal)
        _, hot_ours = hot.summary(wal)
        writes = [b for b, wrote in zip(beat_ours, beats.wrote, strict=True) if wrote]
        reads = [b for b, wrote in zip(beat_ours, beats.wrote, strict=True) if not wrote]
        per_beat = statistics.fmean(beat_ours)
        per_naive = statistics.fmean(naive_ours)
        say(
            f"WAL, {args.wal_heartbeats} unchanged heartbeats at the {args.profile} cadence: "
            f"{len(writes)} extended the lease ({len(writes) / len(beat_ours):.0%}), the rest were pure reads"
        )
        say(
            f"  per unchanged heartbeat: {per_beat:.1f} B this database "
            f"(raw LSN delta mean {statistics.fmean(beat_raw):.1f} B, "
            f"median {statistics.median(beat_raw):.0f} B)"
        )
        if writes:
            say(
                f"  per lease-extension write: mean {statistics.fmean(writes):.1f} B, "
                f"median {statistics.median(writes):.0f} B; per pure read: mean "
                f"{statistics.fmean(reads) if reads else 0:.1f} B"
            )
        say(
            f"  per naive row update: {per_naive:.1f} B this database "
            f"(raw mean {statistics.fmean(naive_raw):.1f} B, median {statistics.median(naive_raw):.0f} B)"
        )
        say(f"  the write rule costs {per_beat / per_naive:.0%} of writing on every heartbeat")
        say(
            f"  reference: a HOT update of the same row (no indexed column changed): "
            f"{statistics.fmean(hot_ours):.1f} B"
        )
        for worker in workers:  # leave the sessions cleanly
            try:
                worker.client.post(
                    wire.SESSION_OFFLINE, {**worker.fence(), "expectedVersion": worker.version}
                )
            except (ApiError, TransportError) as exc:  # pgbench ran meanwhile: idle connections closed
                say(f"offline not answered: {exc}")
        after = pgbench.run(args.pgbench_seconds, 16)
        tps = PgBench.bracket(pgbench.runs[0], after)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        say(
            f"pgbench TPC-B-like, scale 10, 16 clients, {args.pgbench_seconds}s, "
            f"after them: {after:.1f} tps; "
            f"the ratios divide by the mean of the two, {tps:.1f} tps"
        )
        warning = PgBench.unsteady(pgbench.runs[0], after, "the heartbeats")
        if warning:
            say(warning)
        say(
            f"ratios: heartbeats/s to pgbench {rate / tps:.3f}x (target 0.15x); WAL of an unchanged "
            f"heartbeat to a naive update {per_beat / per_naive:.3f} (target ≤ 0.3); load average {load}"
        )
        print(
            f"heartbeats_per_s={rate:.0f} pgbench_tps={tps:.1f} "
            f"wal_bytes_per_unchanged_heartbeat={per_beat:.0f} "
            f"wal_bytes_naive_update={per_naive:.0f}",
            flush=True,
        )
        return 0
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    sys.exit(main())
