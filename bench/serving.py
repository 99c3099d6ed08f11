"""`make bench-serving`: the serving stack, measured — signed heartbeats/s and 300 slow clients.

Usage::

    .venv/bin/python bench/serving.py [--servers waitress,uvicorn,hypercorn,granian] [--clients 8]
        [--seconds 6] [--slow 300] [--watch 25]

Each server runs the same Django project on one fresh SQLite database (standalone profile, rate
limits lifted), in a process of its own, on a free port between 8300 and 8399:

* ``waitress`` — what ``manage.py serve`` ran before: WSGI, 8 threads, 128 KiB body cap, its
  default connection limit (100) and channel timeout (120 s);
* ``uvicorn`` — ASGI on uvloop + httptools, ``qinglong.asgi`` (with ``RequestGuard``),
  ``--limit-concurrency 4096 --timeout-keep-alive 10``;
* ``hypercorn`` — ASGI, ``qinglong.asgi``, ``--read-timeout 10 --keep-alive 10``;
* ``granian`` — ``manage.py serve --no-sweep`` as shipped (Granian, ``qinglong.asgi``).

For each: (1) **throughput** — ``--clients`` enrolled workers send unchanged signed heartbeats
(``agent.client``, one keep-alive connection each) for ``--seconds`` → heartbeats/s, the median
of ``--rounds`` rounds with the servers interleaved (the machine is shared: load moves figures);
(2) **slow clients** — ``--slow`` sockets open at once, half trickling a request head (one byte a
second, never finishing it), half a body (complete head, ``Content-Length: 4000``, one byte a
second); two seconds in, five probes one second apart each time ``GET /healthz`` and one signed
heartbeat on fresh connections (10 s timeout) → worst latency, or "no answer"; then the slow
sockets are watched for ``--watch`` seconds → how many the server cut off, and when.

Prints a table and ends with one machine-readable line::

    <server>_heartbeats_per_s=<n> <server>_healthz_max_ms=<n|none> <server>_heartbeat_max_ms=<n|none>
    <server>_slow_cut_off=<n> <server>_slow_cut_off_max_s=<n> ... (every server, one line)
"""

from __future__ import annotations

import argparse
import http.client
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

VAR = Path(tempfile.mkdtemp(prefix="qinglong-bench-serving-"))
ENV = {
    "DJANGO_SETTINGS_MODULE": "qinglong.settings",
    "QINGLONG_PROFILE": "standalone",
    "QINGLONG_VAR_DIR": str(VAR),
    "DATABASE_URL": f"sqlite:///{VAR / 'bench.sqlite3'}",
    "QINGLONG_RATE_WORKER": "1000000/m",
    "QINGLONG_RATE_AUTH_FAILURES": "1000000/m",
    "QINGLONG_LOG_LEVEL": "WARNING",
}
os.environ.update(ENV)

import django  # noqa: E402

django.setup()

from heartbeat import BenchWorker, configure_django, enroll_workers, free_port  # noqa: E402
from heartbeat_tokens import issue_tokens  # noqa: E402

PROBES = 5
SLOW_BODY_LENGTH = 4000


def say(message: str) -> None:
    print(f"[bench-serving] {message}", flush=True)


def command(server: str, port: int) -> list[str]:
    py = sys.executable
    if server == "waitress":
        return [
            py,
            "-c",
            "from waitress import serve; from qinglong.wsgi import application; "
            f"serve(application, host='127.0.0.1', port={port}, threads=8, "
            "max_request_body_size=131072, ident='qinglong')",
        ]
    if server == "uvicorn":
        return [
            py, "-m", "uvicorn", "qinglong.asgi:application", "--host", "127.0.0.1", "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning",
            "--limit-concurrency", "4096", "--timeout-keep-alive", "10",
        ]  # fmt: skip
    if server == "hypercorn":
        return [
            py, "-m", "hypercorn", "qinglong.asgi:application", "--bind", f"127.0.0.1:{port}",
            "--read-timeout", "10", "--keep-alive", "10", "--log-level", "warning",
        ]  # fmt: skip
    if server == "granian":
        return [py, str(ROOT / "manage.py"), "serve", "--port", str(port), "--no-sweep"]
    raise SystemExit(f"unknown server {server!r}")


def start(server: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    log = open(VAR / f"{server}.log", "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        command(server, port), cwd=ROOT, env={**os.environ}, stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{server} exited: {(VAR / f'{server}.log').read_text()[-2000:]}")
        try:
            if get_healthz(port, timeout=1) is not None:
                return process, port
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"{server} did not answer within 60 s")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def get_healthz(port: int, timeout: float) -> float | None:
    """Seconds until ``GET /healthz`` answered 200 on a fresh connection, None if it did not."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        return time.monotonic() - started if response.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def timed_heartbeat(worker: BenchWorker) -> float | None:
    started = time.monotonic()
    try:
        worker.heartbeat()
    except Exception:  # no answer in time, or an error answer: both are "not served"
        return None
    finally:
        worker.client.close()
    return time.monotonic() - started


def throughput(workers: list[BenchWorker], seconds: float) -> tuple[float, int]:
    counts = [0] * len(workers)
    errors = [0] * len(workers)
    stop_at = time.monotonic() + seconds

    def run(index: int) -> None:
        while time.monotonic() < stop_at:
            try:
                workers[index].heartbeat()
                counts[index] += 1
            except Exception:
                errors[index] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - started), sum(errors)


class SlowClients:
    """``count`` sockets trickling one byte a second each (half heads, half bodies)."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.sockets: list[socket.socket] = []
        self.opened_at: list[float] = []
        self.closed_at: dict[int, float] = {}
        self._stop = threading.Event()
        for index in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.setblocking(False)
            if index % 2:  # a complete head, then a body that never finishes
                head = (
                    "POST /api/v1/worker/session/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {SLOW_BODY_LENGTH}\r\n\r\n"
                )
            else:  # a head that never finishes
                head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
            try:
                sock.send(head.encode())
            except OSError:
                pass
            self.sockets.append(sock)
            self.opened_at.append(time.monotonic())
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        selector = selectors.DefaultSelector()
        for index, sock in enumerate(self.sockets):
            selector.register(sock, selectors.EVENT_READ, index)
        next_byte = time.monotonic()
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=0.05):
                index = key.data
                try:
                    data = key.fileobj.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # the server closed it (after a 408/431, or without a word)
                    self.closed_at[index] = time.monotonic()
                    selector.unregister(key.fileobj)
            if time.monotonic() >= next_byte:
                next_byte += 1.0
                for index, sock in enumerate(self.sockets):
                    if index in self.closed_at:
                        continue
                    try:
                        sock.send(b"a")
                    except BlockingIOError:
                        pass
                    except OSError:
                        self.closed_at[index] = time.monotonic()
                        selector.unregister(sock)
        selector.close()

    def cut_off(self) -> tuple[int, float]:
        """(sockets the server closed, latest close in seconds after opening)."""
        ages = [self.closed_at[i] - self.opened_at[i] for i in self.closed_at]
        return len(ages), max(ages, default=0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.sockets:
            sock.close()


def measure_throughput(server: str, args, tag: str) -> float:
    process, port = start(server)
    try:
        workers = enroll_workers(f"http://127.0.0.1:{port}", issue_tokens(args.clients, f"{server}{tag}"))
        throughput(workers, 1.0)  # warm up
        per_second, errors = throughput(workers, args.seconds)
    finally:
        stop(process)
    say(f"{server}: {per_second:.0f} signed heartbeats/s ({args.clients} clients, {errors} errors)")
    return per_second


def measure_slow(server: str, args, tag: str) -> dict[str, object]:
    process, port = start(server)
    url = f"http://127.0.0.1:{port}"
    try:
        probe_worker = enroll_workers(url, issue_tokens(1, f"{server}{tag}"))[0]
        probe_worker.client.timeout = 10
        slow = SlowClients(port, args.slow)
        time.sleep(2)
        healthz, heartbeats = [], []
        for _ in range(PROBES):
            healthz.append(get_healthz(port, timeout=10))
            heartbeats.append(timed_heartbeat(probe_worker))
            time.sleep(1)
        watch_until = time.monotonic() + args.watch
        while time.monotonic() < watch_until and len(slow.closed_at) < args.slow:
            time.sleep(0.5)
        cut, latest = slow.cut_off()
        slow.close()
    finally:
        stop(process)

    def worst(values: list[float | None]) -> str:
        return "none" if any(v is None for v in values) else f"{max(values) * 1000:.0f}"

    result = {
        "healthz_max_ms": worst(healthz),
        "heartbeat_max_ms": worst(heartbeats),
        "slow_cut_off": cut,
        "slow_cut_off_max_s": f"{latest:.1f}",
    }
    say(
        f"{server}: with {args.slow} slow clients: /healthz worst {result['healthz_max_ms']} ms, "
        f"signed heartbeat worst {result['heartbeat_max_ms']} ms ({PROBES} probes each; none = a probe "
        f"got no answer in 10 s); slow clients cut off: {cut}/{args.slow}, the last after {latest:.1f} s "
        f"(watched {args.watch} s)"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="waitress,uvicorn,hypercorn,granian")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--slow", type=int, default=300)
    parser.add_argument("--watch", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds, servers interleaved")
    args = parser.parse_args()
    configure_django(ENV)  # migrates the fresh database
    say(f"database {ENV['DATABASE_URL']}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    servers = args.servers.split(",")
    rates: dict[str, list[float]] = {server: [] for server in servers}
    for round_number in range(args.rounds):
        for server in servers:
            rates[server].append(measure_throughput(server, args, f"r{round_number}"))
    results = {server: {"heartbeats_per_s": f"{statistics.median(rates[server]):.0f}"} for server in servers}
    if args.slow:
        for server in servers:
            results[server].update(measure_slow(server, args, "slow"))
    say(f"load average at the end {os.getloadavg()[0]:.1f} (other work on this machine skews every figure)")
    print(
        " ".join(
            f"{server}_{key}={value}" for server, result in results.items() for key, value in result.items()
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
