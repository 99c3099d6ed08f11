"""`make bench-dispatch`: how fast work and cancellations reach an idle worker (issue 18).

Usage::

    .venv/bin/python bench/dispatch.py [--runs 25] [--cancels 5] [--idle-seconds 60]
        [--fleet 1000] [--fleet-seconds 90] [--pg-url URL] [--port-base 8300]

One control plane (``manage.py serve`` as shipped: Granian, the in-process sweep loop) on a
fresh database — SQLite in a temporary directory (standalone profile), or ``--pg-url``
(its QingLong tables are wiped) — and real agents (``python -m agent run``), measured twice in
the same run: **long polling** (the agent's default, waiting claims) and **short polling**
(``--no-long-poll``, the claim loop before issue 18, ``--poll-max 5``):

* **enqueue → starting**: ``--runs`` runs of ``true``, each enqueued through the operator API
  after a random idle gap (0.2–2 s) once the previous one finished; latency from just before the
  enqueue request to the lease's starting ACK (``starting_at``, the database clock — same host);
* **cancel → job stopped**: ``--cancels`` runs of ``sleep 300``; once running, the cancel is
  requested through the operator API and the time until the job's whole process group is gone
  is measured (``killpg(pgid, 0)`` polled every 2 ms);
* **idle requests per worker per minute**: the worker API requests the server counted
  (``/metrics``) while the one agent sat idle for ``--idle-seconds`` — heartbeats included.

With ``--pg-url``, **two replicas**: a second ``manage.py serve`` on the same PostgreSQL
database, a real agent waiting on it, and ``--runs`` runs enqueued through the first one's
operator API (the wake-up crosses replicas through ``LISTEN/NOTIFY``): enqueue → starting
percentiles.

Then **the idle fleet** (``--fleet`` simulated workers, 0 to skip): one asyncio process enrolls
and registers that many workers and keeps a waiting claim open for each (signed requests, one
keep-alive connection each, 30 s waits) for ``--fleet-seconds`` against the same single server
process: every answer's time against its bound (late: more than 2 s after it, as this client
measures from sending to the answer; and the p50/p99 of how far past it), refusals, requests per
worker per minute (no heartbeats are sent: the sessions must still be online at the end), the
server's RSS and CPU.

``--runs 0 --cancels 0 --idle-seconds 0`` skips the real agents (the fleet only; their figures
print as ``nan``), ``--fleet 0`` the fleet.

Prints a table and ends with one machine-readable line::

    enqueue_to_starting_p50_ms=<n> enqueue_to_starting_p99_ms=<n> cancel_to_stop_p50_ms=<n>
    idle_requests_per_worker_per_min=<n>

(one line; the long-polling figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

VAR = Path(tempfile.mkdtemp(prefix="qinglong-bench-dispatch-"))


def say(message: str) -> None:
    print(f"[bench-dispatch] {message}", flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--cancels", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--fleet", type=int, default=1000)
    parser.add_argument("--fleet-seconds", type=float, default=90.0)
    parser.add_argument("--pg-url", default="")
    parser.add_argument(
        "--port-base", type=int, default=int(os.environ.get("QINGLONG_BENCH_PORT_BASE", "8300"))
    )
    return parser.parse_args()


ARGS = parse()
ENV = {
    "DJANGO_SETTINGS_MODULE": "qinglong.settings",
    "QINGLONG_PROFILE": "standalone",
    "QINGLONG_VAR_DIR": str(VAR),
    "DATABASE_URL": ARGS.pg_url or f"sqlite:///{VAR / 'bench.sqlite3'}",
    "QINGLONG_LOG_LEVEL": "WARNING",
    "QINGLONG_ACCESS_LOG_LEVEL": "WARNING",
    "DJANGO_SECRET_KEY": "bench-dispatch-only",
}
os.environ.update(ENV)

import django  # noqa: E402

django.setup()

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from heartbeat import SNAPSHOT  # noqa: E402  (bench/heartbeat.py)

from actions.enrollment import enrollment_token_create, worker_create, worker_enroll  # noqa: E402
from actions.tasks import task_create  # noqa: E402
from actions.tokens import api_token_create  # noqa: E402
from leases.models import RunDispatchLease  # noqa: E402
from protocol import wire  # noqa: E402
from protocol.ids import uuid7  # noqa: E402
from protocol.signing import public_key_text, sign_request  # noqa: E402
from protocol.strictjson import dumps  # noqa: E402
from runs.models import Run, RunAttempt  # noqa: E402
from runs.revisions import RevisionSpec  # noqa: E402
from runs.states import RUN_TERMINAL  # noqa: E402
from workers.models import SessionState, WorkerSession  # noqa: E402


def free_port() -> int:
    for port in range(ARGS.port_base, ARGS.port_base + 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit(f"no free port between {ARGS.port_base} and {ARGS.port_base + 99}")


def wipe_postgres() -> None:
    """Drop the QingLong tables of the benchmark database (``--pg-url``), then migrate."""
    with connection.cursor() as cursor:
        cursor.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")


def until(predicate, timeout: float, what: str, step: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise SystemExit(f"no {what} within {timeout} s")


# --- the control plane and the operator API ----------------------------------------------------


class Server:
    def __init__(self, *, operator: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = VAR / "serve.log"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(self.port)],
                cwd=ROOT,
                env={**os.environ},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        until(self._answers, 60, "control plane", step=0.2)
        self.token = ""
        if operator:
            user = get_user_model().objects.create_superuser("bench", password="bench-dispatch-only")
            self.token = api_token_create(user=user, name="bench", role="admin", ttl_seconds=7200).token

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise SystemExit(f"manage.py serve exited: {self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1):
                return True
        except OSError:
            return False

    def ops(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.url + "/api/v1/ops/" + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Token {self.token}"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=15) as answer:
            return json.loads(answer.read())

    def worker_requests(self) -> float:
        """Worker API requests answered so far (``qinglong_http_requests_total``)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("qinglong_http_requests_total{") and 'endpoint="/api/v1/worker/' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.process.pid)
        return [root, *root.children(recursive=True)]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


class RealAgent:
    def __init__(self, server: Server, name: str, *, long_poll: bool) -> None:
        worker = worker_create(name=name, actor="bench")
        self.worker_id = worker.pk
        state = VAR / name
        token = enrollment_token_create(worker_id=worker.pk).token
        agent = [sys.executable, "-m", "agent", "--state-dir", str(state)]
        enrolled = subprocess.run(
            [*agent, "enroll", "--server", server.url, "--token", token, "--worker", name],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if enrolled.returncode != 0:
            raise SystemExit(f"enroll failed: {enrolled.stderr}")
        command = [
            *agent,
            "run",
            "--server",
            server.url,
            "--work-dir",
            str(state / "work"),
            "--poll-max",
            "5",
        ]
        self.log = VAR / f"{name}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [*command, *([] if long_poll else ["--no-long-poll"])],
                cwd=ROOT,
                env={**os.environ, "QINGLONG_WORKER_LOG_LEVEL": "WARNING"},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        until(
            lambda: WorkerSession.objects.filter(worker_id=worker.pk, state=SessionState.ONLINE).exists(),
            60,
            "agent session",
            step=0.1,
        )

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


NAN = float("nan")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def measure_agent(
    server: Server,
    *,
    long_poll: bool,
    tag: str,
    through: Server | None = None,
    runs: int | None = None,
    cancel_runs: int | None = None,
    idle_seconds: float | None = None,
) -> dict[str, float]:
    """One real agent on ``server``: ``runs`` enqueue→starting latencies (runs enqueued through
    ``through``'s operator API, default ``server``), ``cancel_runs`` cancel→stopped latencies and the
    requests it sends idle for ``idle_seconds`` (defaults: the command line's)."""
    runs = ARGS.runs if runs is None else runs
    cancel_runs = ARGS.cancels if cancel_runs is None else cancel_runs
    idle_seconds = ARGS.idle_seconds if idle_seconds is None else idle_seconds
    operator = through or server
    agent = RealAgent(server, f"bench-{tag}", long_poll=long_poll)
    quick = task_create(
        name=f"quick-{tag}", spec=RevisionSpec(executor="shell", command="true", timeout_seconds=30)
    )
    slow = task_create(
        name=f"slow-{tag}", spec=RevisionSpec(executor="shell", command="sleep 300", timeout_seconds=600)
    )
    time.sleep(1.0)  # the agent settles into its idle loop
    latencies: list[float] = []
    from_commit: list[float] = []
    for _ in range(runs):
        time.sleep(random.uniform(0.2, 2.0))
        sent = time.time()
        run = operator.ops("runs", {"revisionId": str(quick.pk)})
        lease = until(
            lambda run_id=run["id"]: RunDispatchLease.objects.filter(
                run_id=run_id, starting_at__isnull=False
            ).first(),
            60,
            "starting ACK",
        )
        latencies.append((lease.starting_at.timestamp() - sent) * 1000)
        created = Run.objects.get(pk=run["id"]).created_at.timestamp()
        from_commit.append((lease.starting_at.timestamp() - created) * 1000)
        until(lambda run_id=run["id"]: Run.objects.get(pk=run_id).state in RUN_TERMINAL, 60, "run end")
    cancels = []
    for _ in range(cancel_runs):
        run = operator.ops("runs", {"revisionId": str(slow.pk)})
        attempt = until(
            lambda run_id=run["id"]: RunAttempt.objects.filter(run_id=run_id, pgid__isnull=False).first(),
            60,
            "running job",
        )
        time.sleep(random.uniform(0.5, 2.0))
        sent = time.monotonic()
        operator.ops(f"runs/{run['id']}/cancel", {"reason": "bench"})

        def gone(pgid: int = attempt.pgid) -> bool:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            return False

        until(gone, 60, "job stop", step=0.002)
        cancels.append((time.monotonic() - sent) * 1000)
        until(lambda run_id=run["id"]: Run.objects.get(pk=run_id).state in RUN_TERMINAL, 60, "run end")
    idle = NAN
    if idle_seconds > 0:
        time.sleep(2.0)  # the last completion's follow-up requests
        before = server.worker_requests()
        time.sleep(idle_seconds)
        idle = (server.worker_requests() - before) / idle_seconds * 60
    agent.stop()

    def at(values: list[float], fraction: float) -> float:
        return percentile(values, fraction) if values else NAN

    return {
        "p50": at(latencies, 0.5),
        "db_p50": at(from_commit, 0.5),
        "db_p99": at(from_commit, 0.99),
        "p90": at(latencies, 0.9),
        "p99": at(latencies, 0.99),
        "max": max(latencies, default=NAN),
        "cancel_p50": statistics.median(cancels) if cancels else float("nan"),
        "cancel_max": max(cancels) if cancels else float("nan"),
        "idle": idle,
    }


# --- the idle fleet ---------------------------------------------------------------------------


class SimWorker:
    def __init__(self, credential_id: str, key: Ed25519PrivateKey) -> None:
        self.credential_id = credential_id
        self.key = key
        self.session_id = ""
        self.generation = 0
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None


async def signed_post(worker: SimWorker, port: int, path: str, body: dict) -> tuple[int, dict]:
    raw = dumps(body)
    headers = {
        "Host": f"127.0.0.1:{port}",
        "Content-Type": "application/json",
        "Content-Length": str(len(raw)),
        **sign_request(
            method="POST", path=path, body=raw, key_id=worker.credential_id, private_key=worker.key
        ),
    }
    if worker.writer is None:
        worker.reader, worker.writer = await asyncio.open_connection("127.0.0.1", port)
    assert worker.reader is not None
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    worker.writer.write(head.encode() + raw)
    await worker.writer.drain()
    status_line, *lines = (await worker.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = 0
    for line in lines:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value.strip())
    payload = await worker.reader.readexactly(length)
    return int(status_line.split()[1]), json.loads(payload)


def enroll_fleet(count: int) -> list[SimWorker]:
    say(f"enrolling {count} simulated workers")
    workers = []
    for index in range(count):
        worker = worker_create(name=f"bench-fleet-{index}", actor="bench")
        key = Ed25519PrivateKey.generate()
        token = enrollment_token_create(worker_id=worker.pk).token
        credential = worker_enroll(token=token, public_key=public_key_text(key.public_key()))
        workers.append(SimWorker(credential.pk, key))
    return workers


async def fleet(server: Server, workers: list[SimWorker], seconds: float) -> dict[str, float]:
    """Each simulated worker registers (at a random moment of the first 30 s, as a fleet comes
    up), then holds waiting claims back to back until ``seconds`` have passed; no heartbeats."""
    count = len(workers)
    stats: dict[str, float] = {
        "requests": 0,
        "refused": 0,
        "late": 0,
        "answered": 0,
        "worst_over_bound_s": 0.0,
    }
    active_seconds = 0.0
    #: Seconds each answer came after its bound, as this client measured it (send to answer).
    overs: list[float] = []
    started = time.monotonic()
    end = started + seconds
    cpu_before = sum(p.cpu_times().user + p.cpu_times().system for p in server.tree())
    rss_peak = 0

    def count_as(name: str) -> None:
        stats[name] = stats.get(name, 0) + 1

    async def life(worker: SimWorker) -> None:
        nonlocal active_seconds
        await asyncio.sleep(random.uniform(0, 30))
        status, answer = await signed_post(
            worker,
            server.port,
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
        if status not in (200, 201):
            count_as(f"register_refused_{answer.get('code')}")
            return
        worker.session_id, worker.generation = answer["sessionId"], answer["generation"]
        since = time.monotonic()
        while time.monotonic() < end:
            body = {
                "sessionId": worker.session_id,
                "generation": worker.generation,
                "offers": [{"offerId": str(uuid7()), "leaseToken": os.urandom(24).hex()}],
                "watch": [],
                "waitSeconds": 30,
            }
            sent = time.monotonic()
            stats["requests"] += 1
            try:
                status, answer = await asyncio.wait_for(
                    signed_post(worker, server.port, wire.CLAIM_WAIT, body), timeout=60
                )
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                count_as(f"no_answer_{type(exc).__name__}")
                stats["late"] += 1
                worker.writer = None  # reconnect, as the agent's client does
                continue
            took = time.monotonic() - sent
            if status != 200:
                stats["refused"] += 1
                count_as(f"refused_{status}_{answer.get('code')}")
                await asyncio.sleep(1)
                continue
            stats["answered"] += 1
            over = took - answer["waitSeconds"]
            overs.append(over)
            stats["worst_over_bound_s"] = max(stats["worst_over_bound_s"], over)
            if over > 2.0:
                stats["late"] += 1
        active_seconds += time.monotonic() - since

    async def sample() -> None:
        nonlocal rss_peak
        while time.monotonic() < end:
            rss_peak = max(rss_peak, sum(p.memory_info().rss for p in server.tree()))
            await asyncio.sleep(1)
        # Every worker still holds a wait now: were they all kept alive without a heartbeat?
        ids = [w.session_id for w in workers if w.session_id]
        stats["sessions_online_at_end"] = await asyncio.to_thread(
            lambda: WorkerSession.objects.filter(pk__in=ids, state=SessionState.ONLINE).count()
        )
        stats["sessions_registered"] = len(ids)

    await asyncio.gather(sample(), *(life(w) for w in workers))
    wall = time.monotonic() - started
    cpu = sum(p.cpu_times().user + p.cpu_times().system for p in server.tree()) - cpu_before
    for worker in workers:
        if worker.writer is not None:
            worker.writer.close()
    return {
        **stats,
        "over_bound_p50_s": percentile(overs, 0.5) if overs else 0.0,
        "over_bound_p99_s": percentile(overs, 0.99) if overs else 0.0,
        "answers_over_1s": sum(over > 1.0 for over in overs),
        "requests_per_worker_per_min": stats["requests"] / (active_seconds / 60) if active_seconds else 0.0,
        "rss_mib": rss_peak / 2**20,
        "cpu_percent_of_one_core": cpu / wall * 100,
        "workers": count,
    }


def main() -> int:
    if ARGS.pg_url:
        wipe_postgres()
    call_command("migrate", verbosity=0)
    server = Server()
    say(f"control plane on {server.url}, database {connection.vendor}, temporary files in {VAR}")
    try:
        if ARGS.runs or ARGS.cancels or ARGS.idle_seconds:
            say("long polling (waiting claims, the default)")
            long_poll = measure_agent(server, long_poll=True, tag="long")
            say("short polling (--no-long-poll --poll-max 5: the claim loop before issue 18)")
            short_poll = measure_agent(server, long_poll=False, tag="short")
        else:  # --runs 0 --cancels 0 --idle-seconds 0: the fleet only
            long_poll = short_poll = dict.fromkeys(
                ("p50", "p90", "p99", "max", "db_p50", "db_p99", "cancel_p50", "cancel_max", "idle"), NAN
            )
        print()
        print(f"{'':24}{'long polling':>16}{'short polling':>16}")
        for key, label in [
            ("p50", "enqueue->starting p50 ms"),
            ("p90", "enqueue->starting p90 ms"),
            ("p99", "enqueue->starting p99 ms"),
            ("max", "enqueue->starting max ms"),
            ("db_p50", "run created->starting p50"),
            ("db_p99", "run created->starting p99"),
            ("cancel_p50", "cancel->stopped p50 ms"),
            ("cancel_max", "cancel->stopped max ms"),
            ("idle", "idle requests/worker/min"),
        ]:
            print(f"{label:24}{long_poll[key]:>16.1f}{short_poll[key]:>16.1f}")
        print(f"({ARGS.runs} runs and {ARGS.cancels} cancels each, idle window {ARGS.idle_seconds:g} s)")
        replicas = {}
        if ARGS.pg_url and ARGS.runs:
            say("two replicas on PostgreSQL: runs enqueued through this one, the agent waits on another")
            other = Server(operator=False)
            try:
                replicas = measure_agent(
                    other, long_poll=True, tag="replica", through=server, cancel_runs=0, idle_seconds=0
                )
            finally:
                other.stop()
            print(
                f"two replicas: enqueue->starting p50 {replicas['p50']:.1f} ms, p90 {replicas['p90']:.1f} ms,"
                f" p99 {replicas['p99']:.1f} ms, max {replicas['max']:.1f} ms ({ARGS.runs} runs)"
            )
        if ARGS.fleet:
            say(f"idle fleet: {ARGS.fleet} simulated workers, waiting claims for {ARGS.fleet_seconds:g} s")
            workers = enroll_fleet(ARGS.fleet)
            figures = asyncio.run(fleet(server, workers, ARGS.fleet_seconds))
            for key, value in figures.items():
                print(f"fleet {key}: {value:.2f}" if isinstance(value, float) else f"fleet {key}: {value}")
        else:
            figures = {"refused": 0, "late": 0}
        load = os.getloadavg()
        print(f"load average (1/5/15 min) at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        # The four required keys first, then the fleet's failures (0 and 0 for a healthy fleet, or
        # when --fleet 0 skipped it), so that a failing fleet shows on the machine-readable line.
        print(
            f"enqueue_to_starting_p50_ms={long_poll['p50']:.0f} "
            f"enqueue_to_starting_p99_ms={long_poll['p99']:.0f} "
            f"cancel_to_stop_p50_ms={long_poll['cancel_p50']:.0f} "
            f"idle_requests_per_worker_per_min={long_poll['idle']:.2f} "
            f"fleet_refused={int(figures['refused'])} fleet_late={int(figures['late'])}"
            + (
                f" two_replicas_p50_ms={replicas['p50']:.0f} two_replicas_p99_ms={replicas['p99']:.0f}"
                if replicas
                else ""
            )
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
