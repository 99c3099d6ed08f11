"""Real processes for end-to-end tests: ``manage.py serve`` on the test database, the worker
agent, ``manage.py`` commands — each a separate process, as in production.

Servers listen on 127.0.0.1 ports 8600-8699 only (``QINGLONG_TEST_PORT_BASE`` moves the range, for
checkouts testing side by side); each pytest-xdist worker takes its own slice. A port is taken
with the lock ``manage.py serve`` takes for it (``claim_port``), and a stopped
:class:`ControlPlane` keeps holding that lock until it starts again: an outage test's port stays
its own while its server is away, so another checkout's server cannot start on it and answer the
test's agents in its place.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from django.core.management.base import CommandError
from django.db import connection

from console.management.commands.serve import claim_port

ROOT = Path(__file__).resolve().parents[2]
PORT_BASE = int(os.environ.get("QINGLONG_TEST_PORT_BASE", "8600"))
PORTS = range(PORT_BASE, PORT_BASE + 100)


def database_url() -> str:
    """The URL of the database this test runs on (pytest-django's test database)."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    credentials = settings["USER"] + (f":{settings['PASSWORD']}" if settings.get("PASSWORD") else "")
    return f"postgres://{credentials}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"


@contextmanager
def celery_beat(
    redis_url: str, var_dir: Path, **env: str
) -> Iterator[Callable[[Callable[[], bool], str], None]]:
    """A real ``celery worker --beat`` process on Redis, pointed at this test's database.

    PostgreSQL leg: the cluster profile itself (its system checks demand PostgreSQL and Redis);
    SQLite leg: the standalone profile, which may use Celery too. ``env``: extra environment.
    Yields ``wait(done, what)``: poll ``done()`` for up to 60 s, failing with the worker's log if
    it exits or ``what`` does not happen. The process is terminated (then killed) on exit.
    """
    queue = f"qinglong-test-{uuid.uuid4().hex}"
    full_env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": redis_url,
        "REDIS_URL": redis_url,
        "QINGLONG_CELERY_QUEUE": queue,
        "QINGLONG_SWEEP_INTERVAL_SECONDS": "0.5",
        "QINGLONG_VAR_DIR": str(var_dir),
        "QINGLONG_PROFILE": "cluster-control" if connection.vendor == "postgresql" else "standalone",
        "DJANGO_SECRET_KEY": "celery-beat-test-only",
        **env,
    }
    full_env.pop("QINGLONG_TEST_LEG", None)
    log = var_dir / "celery.log"
    command = [sys.executable, "-m", "celery", "-A", "qinglong", "worker", "--beat", "--pool=solo"]
    command += ["--loglevel=INFO", f"--schedule={var_dir / 'beat-schedule'}", "-Q", queue]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT)

        def wait(done: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 60
            while not done():
                assert process.poll() is None, f"celery exited {process.returncode}:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"no {what} within 60 s:\n{log.read_text()}"
                time.sleep(0.2)

        try:
            yield wait
        finally:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def free_port() -> int:
    """A free port in this xdist worker's slice of :data:`PORTS`: nothing listens on it and no
    server, running or stopped (:meth:`ControlPlane.stop`), holds its serve lock."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    width = 25
    for port in PORTS[index * width % len(PORTS) :][:width]:
        held = reserve_port(port)
        if held is not None:
            held.close()
            return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


def reserve_port(port: int) -> IO[str] | None:
    """Take ``port``'s serve lock (``manage.py serve``'s ``claim_port``: an exclusive lock, then a
    bind probe) and return the open lock file that holds it, or None when the port is taken."""
    try:
        return claim_port("127.0.0.1", port)
    except CommandError:
        return None


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition", step: float = 0.1):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def manage(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``manage.py`` in a separate process against the test database."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DATABASE_URL": database_url(), **(env or {})},
    )


class ControlPlane:
    """``manage.py serve`` (Granian + in-process sweeps) on the test database; stop/start at will."""

    def __init__(self, log_dir: Path, **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "QINGLONG_PROFILE": "standalone",
            "QINGLONG_LOG_LEVEL": "INFO",
            **settings,
        }
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.started = False
        self._reservation: IO[str] | None = None  # the port's serve lock while stopped

    def start(self) -> None:
        """Start ``manage.py serve``; before the first successful start, a port another process
        took since :func:`free_port` picked it (the machine is shared) is swapped for a new one."""
        for _ in range(3):
            try:
                self._start()
                self.started = True
                return
            except AssertionError as exc:
                # a taken port: refused up front, or lost to another program before Granian's
                # server process bound it (other checkouts' tests share 8600-8699)
                taken = "cannot listen on" in str(exc) or "Address already in use" in str(exc)
                if self.started or not taken:
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        raise AssertionError("no free port for the control plane after 3 tries")

    def _start(self) -> None:
        self.starts += 1
        if self._reservation is not None:  # the server takes the port's lock itself
            self._reservation.close()
            self._reservation = None
        log = open(self.log_dir / f"serve-{self.starts}.log", "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "serve",
                "--port",
                str(self.port),
                "--threads",
                "4",
                "--sweep-interval",
                "0.5",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._answers, timeout=30, what=f"the control plane on {self.url}")

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"manage.py serve exited with {self.process.returncode}: {self.log()}")
        try:  # /healthz answers this JSON only from this project's server, not from a stranger
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as answer:
                return answer.read() == b'{"status": "ok"}'
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and hold its port's serve lock until
        the next start (module docstring); the lock goes with this object."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
        if self._reservation is None:
            self._reservation = reserve_port(self.port)

    def log(self) -> str:
        return (self.log_dir / f"serve-{self.starts}.log").read_text(errors="replace")[-4000:]


class Agent:
    """``python -m agent …`` with its stderr kept in a file (the agent logs there)."""

    def __init__(self, state: Path, log_dir: Path) -> None:
        self.state = state
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None
        self.runs = 0

    def start(self, *args: str) -> subprocess.Popen:
        self.runs += 1
        self.log_path = self.log_dir / f"agent-{self.runs}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed with the process
        env = {**os.environ, "QINGLONG_WORKER_LOG_LEVEL": "INFO"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agent", "--state-dir", str(self.state), *args],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self.process

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
