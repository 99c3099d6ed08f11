"""Serve the control plane: the ASGI app under Granian, plus the in-process sweep loop.

Granian (Rust, hyper) holds the connections on an event loop — a slow or idle client costs a
socket and a coroutine, not a thread — bounds them per process, cuts off a client whose request
head has not arrived within ``QINGLONG_HEADER_TIMEOUT_SECONDS`` and refuses oversized header
blocks; ``qinglong.serving.RequestGuard`` adds the header count, body size and body deadline
limits (docs/deploy.md has the table and bench/serving.py the measurements behind the choice).

The standalone profile has no broker: this process also runs the dispatch/sweep cycle every
``--sweep-interval`` seconds in one background thread, while Granian's worker process(es)
serve requests. In the cluster-control profile Celery beat runs the cycle; pass ``--sweep`` to
run it here as well (cycles are safe to overlap).
"""

import fcntl
import logging
import multiprocessing
import os
import socket
import tempfile
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from granian.constants import HTTPModes, Interfaces, Loops
from granian.http import HTTP1Settings
from granian.log import LogLevels
from granian.server import MPServer

from actions.liveness import beat_loop
from actions.sweeps import loop
from core.conf import SERVE_DB_POOL_VARIABLE, SERVE_STOP_FILE_VARIABLE, is_cluster, protocol

log = logging.getLogger("qinglong.serve")


def forget_dead_processes(directory: Path) -> int:
    """Delete the metric files (``<kind>_<pid>.db``) of processes that no longer run; returns how
    many. prometheus_client sums every file in ``PROMETHEUS_MULTIPROC_DIR``, so the files of an
    earlier run would otherwise keep adding to this one's series."""
    removed = 0
    for path in directory.glob("*_*.db"):
        pid = path.stem.rsplit("_", 1)[-1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
            removed += 1
        except PermissionError:  # alive, someone else's
            continue
    return removed


def _stop_when_told(told: Callable[[], bool], stop: threading.Event) -> None:
    """Stop the sweep loop and the liveness beat as soon as ``told()`` — Granian was told to shut
    down (SIGTERM, SIGINT): a replica that is going away neither settles nor counts as serving
    meanwhile (docs/leases.md, Outages)."""
    while not stop.wait(0.1):
        if told():
            stop.set()


def _answers_healthz(host: str, port: int) -> bool:
    """Whether this server answers its own ``/healthz`` (200) at ``host:port`` now."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        with urllib.request.urlopen(f"http://{netloc}/healthz", timeout=1) as answer:  # noqa: S310
            return answer.status == 200
    except (OSError, ValueError):
        return False


def _wait_until_serving(host: str, port: int, ready: threading.Event, stop: threading.Event) -> None:
    """Set ``ready`` once the server processes answer requests (their Django set up): the liveness
    beat starts only then, so an outage's grace window (docs/leases.md, Outages) opens when this
    replica can take the calls it excuses, not seconds before, while its processes still start."""
    while not stop.is_set():
        if _answers_healthz(host, port):
            ready.set()
            return
        stop.wait(0.1)


def claim_port(host: str, port: int) -> IO[str]:
    """Make ``host:port`` this server's, or raise CommandError; keep the returned file open.

    Granian's server processes bind with ``SO_REUSEPORT``, which lets two servers of the same
    user share a port, each answering part of the requests. So a server takes an exclusive lock
    named after the address (in the system's temporary directory, shared by every checkout on
    this host) before anything binds, and a plain bind then proves no other program holds it.
    """
    lock = open(Path(tempfile.gettempdir()) / f"qinglong-serve-{host}-{port}.lock", "w")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise CommandError(f"cannot listen on {host}:{port}: another control plane serves it") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is fine
        try:
            probe.bind((host, port))
        except OSError as exc:
            lock.close()
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return lock


class _Server(MPServer):
    """Granian's (multi-process) server, which first tells its server processes that it is
    stopping: Granian waits for open requests before it stops, and a waiting claim would hold it
    up to its bound. The file ``QINGLONG_SERVE_STOP_FILE`` names appears; ``api.waiting`` sees it
    and ends the waits."""

    def signal_handler_interrupt(self, *args, **kwargs):
        Path(os.environ[SERVE_STOP_FILE_VARIABLE]).touch()
        super().signal_handler_interrupt(*args, **kwargs)


class Command(BaseCommand):
    help = "Serve the control plane (Granian, ASGI) with the in-process sweep loop."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="requests inside Django at once per process (default QINGLONG_MAX_ACTIVE_REQUESTS)",
        )
        parser.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
        parser.add_argument("--sweep-interval", type=float, default=2.0, help="seconds between sweep cycles")
        parser.add_argument(
            "--sweep", action="store_true", help="run the sweep loop in the cluster profile too"
        )
        parser.add_argument("--no-sweep", action="store_true", help="do not run the sweep loop here")

    def handle(self, *args, **options):
        if options["threads"] is not None:
            # Read by qinglong.asgi in the server processes (they inherit this environment).
            os.environ["QINGLONG_MAX_ACTIVE_REQUESTS"] = str(options["threads"])
        limits = settings.QINGLONG_SERVER
        held = claim_port(options["host"], options["port"])
        forget_dead_processes(settings.PROMETHEUS_MULTIPROC_DIR)
        # Server processes start fresh (spawn), never as a fork of this one: the sweep thread
        # and its database connection must not be copied into them mid-flight.
        multiprocessing.set_start_method("spawn", force=True)
        # Read by api.waiting in the server processes (they inherit this environment).
        stop_file = (
            Path(tempfile.gettempdir()) / f"qinglong-serve-{options['host']}-{options['port']}.stopping"
        )
        stop_file.unlink(missing_ok=True)
        os.environ[SERVE_STOP_FILE_VARIABLE] = str(stop_file)
        # Read by qinglong.settings in the server processes: each keeps a pool of PostgreSQL
        # connections instead of opening one per request (docs/deploy.md). This process keeps
        # Django's plain connections (its sweep and liveness threads hold theirs).
        os.environ.setdefault(SERVE_DB_POOL_VARIABLE, "1")
        server = _Server(
            "qinglong.asgi:application",
            address=options["host"],
            port=options["port"],
            interface=Interfaces.ASGINL,
            # uvloop, named rather than left to Granian's "auto": auto takes whichever loop package
            # happens to be installed (rloop, an early-stage loop, before uvloop), so the loop the
            # tests and bench-claim ran on would not be the one a deployment gets.
            loop=Loops.uvloop,
            workers=options["workers"],
            http=HTTPModes.http1,
            websockets=False,
            backlog=limits["BACKLOG"],
            backpressure=limits["MAX_CONNECTIONS"],
            http1_settings=HTTP1Settings(
                header_read_timeout=int(limits["HEADER_TIMEOUT_SECONDS"] * 1000),
                keep_alive=True,
                max_buffer_size=max(8192, limits["MAX_HEADER_BYTES"]),
            ),
            log_enabled=True,
            log_level=LogLevels.warning,
            log_dictconfig=settings.LOGGING,
            log_access=False,  # qinglong.access writes the access log (request id, worker/user)
            # A server process that dies takes the whole server down (exit 1): systemd restarts it
            # (Restart=on-failure) instead of Granian respawning a process that cannot bind.
            respawn_failed_workers=False,
        )
        stop = threading.Event()

        def told_to_stop() -> bool:
            return bool(server.interrupt_signal)

        # Every replica beats the control plane's liveness row while it can serve (docs/leases.md,
        # Outages): the sweeps excuse what lapsed while no replica could. From the moment its
        # server processes answer, not before: the grace window after an outage opens with it.
        ready = threading.Event()
        threading.Thread(
            target=_wait_until_serving,
            args=(options["host"], options["port"], ready, stop),
            name="readiness-probe",
            daemon=True,
        ).start()
        threading.Thread(
            target=beat_loop,
            args=(stop, protocol().liveness_beat_seconds, lambda: ready.is_set() and not told_to_stop()),
            name="liveness-beat",
            daemon=True,
        ).start()
        sweeping = not options["no_sweep"] and (options["sweep"] or not is_cluster())
        if sweeping:
            threading.Thread(
                target=loop, args=(stop, options["sweep_interval"]), name="sweep-loop", daemon=True
            ).start()
        # A log line, not stdout: under QINGLONG_LOG_FORMAT=json it is JSON like every other line.
        log.info(
            "control plane on http://%s:%s/ (profile %s, %s server process(es), sweeps %s)",
            options["host"],
            options["port"],
            settings.QINGLONG_PROFILE,
            options["workers"],
            "in-process" if sweeping else "elsewhere",
        )
        threading.Thread(
            target=_stop_when_told, args=(told_to_stop, stop), name="shutdown-watch", daemon=True
        ).start()
        try:
            server.serve()
        finally:
            stop.set()
            stop_file.unlink(missing_ok=True)
            held.close()
