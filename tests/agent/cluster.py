"""A private cluster-profile control plane for fault injection: its own PostgreSQL cluster and Redis
server on ports of its own, two ``manage.py serve`` replicas and real agents — all processes this
module starts and stops itself (the shared PostgreSQL and Redis are never touched).

No Django here: the pieces are separate processes, and the checks read the private database with
psycopg. Used by ``tests/agent/test_dependency_outages.py`` and ``bench/chaos.py`` (``make chaos``).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def pg_bin(name: str) -> str:
    """The newest installed PostgreSQL server binary ``name`` (initdb, pg_ctl, …)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError(f"no PostgreSQL {name} under /usr/lib/postgresql/*/bin")
    return found[-1]


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(first: int, last: int, count: int) -> list[int]:
    """``count`` ports free now in ``first``–``last``."""
    ports = [port for port in range(first, last + 1) if port_free(port)][:count]
    if len(ports) < count:
        raise RuntimeError(f"fewer than {count} free ports in {first}-{last}")
    return ports


def poll(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class PrivatePostgres:
    """``initdb`` + ``pg_ctl`` on ``port``; trust auth for ``postgres`` on 127.0.0.1.

    PostgreSQL refuses to run as root: when this process is root, the cluster lives in a fresh
    directory owned by the ``postgres`` system user and its tools run as that user (``runuser``).
    """

    def __init__(self, root: Path, port: int) -> None:
        self.port = port
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.root = Path(tempfile.mkdtemp(prefix=f"qinglong-pg-{port}-"))
            shutil.chown(self.root, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        else:
            self.root = root
        self.data = self.root / "pgdata"
        self.log = self.root / "postgres.log"
        self._run(pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.url = f"postgres://postgres@127.0.0.1:{port}/qinglong"

    def _run(self, *command: str, check: bool = True) -> None:
        done = subprocess.run([*self.as_user, *command], capture_output=True, text=True, cwd="/")
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {done.returncode}: {done.stdout}{done.stderr}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def create_database(self) -> None:
        with psycopg.connect(f"postgres://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE qinglong")

    def query(self, sql: str, *args: Any) -> list[tuple]:
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            return conn.execute(sql, args).fetchall()

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root if self.as_user else self.data, ignore_errors=True)


class PrivateRedis:
    """``redis-server`` on ``port``, no persistence; :meth:`stop` and :meth:`start` at will."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.process: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{port}/0"

    def start(self) -> None:
        log = open(self.root / f"redis-{self.port}.log", "ab")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        poll(lambda: not port_free(self.port), 10, f"redis-server on {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


class Replica:
    """One ``manage.py serve`` of the cluster profile (sweeping in-process) on ``port``."""

    def __init__(self, root: Path, port: int, env: dict[str, str], name: str) -> None:
        self.root, self.port, self.env, self.name = root, port, env, name
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_path(), "wb")  # noqa: SIM115 - closed with the process
        command = [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(self.port)]
        command += ["--threads", "4", "--sweep", "--sweep-interval", "0.5"]
        self.process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        poll(self.answers, 60, f"replica {self.name} on {self.url}")

    def log_path(self) -> Path:
        return self.root / f"{self.name}-{self.starts}.log"

    def answers(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(
                f"replica {self.name} exited: {self.log_path().read_text(errors='replace')[-3000:]}"
            )
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        """SIGKILL: the replica dies mid-request, as a crashed host's would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def logs(self) -> str:
        return "".join(
            (self.root / f"{self.name}-{n}.log").read_text(errors="replace")
            for n in range(1, self.starts + 1)
        )


def control_plane_env(pg: PrivatePostgres, redis_url: str, var_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a cluster-profile process on the private database and Redis."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(
            ("QINGLONG_", "DATABASE_URL", "REDIS_URL", "CELERY_", "PYTEST", "DJANGO_SETTINGS")
        )
    }
    env.update(
        {
            "DATABASE_URL": pg.url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "QINGLONG_PROFILE": "cluster-control",
            "QINGLONG_VAR_DIR": str(var_dir),
            "QINGLONG_LOG_LEVEL": "INFO",
            "DJANGO_SECRET_KEY": "private-cluster-test-only",
            **settings,
        }
    )
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} exited {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout


class Agent:
    """A real ``python -m agent`` (with its real job guard), enrolled against ``server``."""

    def __init__(self, root: Path, name: str) -> None:
        self.state = root / f"agent-{name}"
        self.name = name
        self.log_path = root / f"agent-{name}.log"
        self.process: subprocess.Popen | None = None

    def enroll(self, env: dict[str, str], server: str) -> None:
        token = manage(env, "enroll_worker", self.name, "--token-only").strip()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "agent",
                "--state-dir",
                str(self.state),
                "enroll",
                "--server",
                server,
                "--token",
                token,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise AssertionError(f"enroll {self.name}: {done.stderr[-2000:]}")

    def start(self, *args: str) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        env = {**os.environ, "QINGLONG_WORKER_LOG_LEVEL": "INFO"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agent", "--state-dir", str(self.state), "run", "--poll-max", "1", *args],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def create_task(
    env: dict[str, str], name: str, command: str, *, runs: int, lost_retry: str = "never"
) -> None:
    """Create task ``name`` running ``command`` and enqueue ``runs`` runs of it (one process)."""
    code = (
        "from actions.tasks import task_create\n"
        "from actions.runs import run_enqueue\n"
        "from runs.revisions import RevisionSpec\n"
        f"r = task_create(name={name!r}, spec=RevisionSpec(executor='shell', command={command!r}, "
        f"timeout_seconds=600, max_attempts=2, lost_retry={lost_retry!r}))\n"
        f"for _ in range({runs}): run_enqueue(revision_id=r.pk)\n"
    )
    manage(env, "shell", "-c", code)


def invariants(pg: PrivatePostgres) -> dict[str, int]:
    """What the database says after the faults: runs, lost attempts, expired sessions, runs with
    two attempts that overlapped in time (a double execution), runs not succeeded."""
    runs = pg.query("SELECT count(*) FROM runs_run")[0][0]
    lost = pg.query("SELECT count(*) FROM runs_runattempt WHERE state = 'lost'")[0][0]
    expired = pg.query("SELECT count(*) FROM workers_workersession WHERE state = 'expired'")[0][0]
    overlapping = pg.query(
        "SELECT count(*) FROM runs_runattempt a JOIN runs_runattempt b"
        " ON a.run_id = b.run_id AND a.number < b.number"
        " WHERE a.started_at IS NOT NULL AND b.started_at IS NOT NULL "
        "AND b.started_at < coalesce(a.finished_at, 'infinity'::timestamptz)"
    )[0][0]
    unfinished = pg.query("SELECT count(*) FROM runs_run WHERE state <> 'succeeded'")[0][0]
    return {
        "runs": runs,
        "lost": lost,
        "expired": expired,
        "double_executions": overlapping,
        "unfinished": unfinished,
    }


class TcpProxy:
    """A TCP proxy on ``port`` to ``target_port`` whose traffic can be dropped: while
    :attr:`partitioned` is set, bytes in both directions are swallowed (connections stay open, no
    answer comes back — a network partition, not a refused connection).

    Given more ``target_ports``, it is a small load balancer, as replicas are deployed behind one:
    each new connection goes to the next port in turn, or to the one after it when that refuses."""

    def __init__(self, port: int, target_port: int, *target_ports: int) -> None:
        self.port, self.target_port = port, target_port
        self.targets = [target_port, *target_ports]
        self._turn = 0
        self.partitioned = threading.Event()
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._server.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = self._connect()
            if upstream is None:
                client.close()
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        self._turn += 1
        for n in range(len(self.targets)):
            target = self.targets[(self._turn + n) % len(self.targets)]
            try:
                return socket.create_connection(("127.0.0.1", target), timeout=5)
            except OSError:
                continue
        return None

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(0.5)
        while not self._stop.is_set():
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if self.partitioned.is_set():
                continue  # dropped on the floor
            try:
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._server.close()
