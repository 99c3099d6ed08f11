"""PostgreSQL helpers shared by the benchmarks (they run as scripts: ``python bench/x.py``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from urllib.parse import urlsplit

import psycopg
from psycopg import sql


def admin_connect(url: str):
    """An autocommit connection to the server's ``postgres`` database (to create or drop others)."""
    parts = urlsplit(url)
    return psycopg.connect(
        host=parts.hostname,
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password or None,
        dbname="postgres",
        autocommit=True,
    )


#: Two pgbench runs around a figure further apart than this share of the larger mark the window
#: unsteady (:meth:`PgBench.unsteady`): back-to-back runs of pgbench alone spread by about a tenth.
UNSTEADY = 0.25


def dbname(url: str) -> str:
    """The database name in a postgres:// URL."""
    return urlsplit(url).path.lstrip("/")


def ensure_database(url: str) -> None:
    """Create the database ``url`` names if the server does not have it yet."""
    with admin_connect(url) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname(url),)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname(url))))


def checkpoint(url: str) -> None:
    """``CHECKPOINT`` now, before a measurement window: the server's timed checkpoint (every 5 min)
    then falls outside a window of seconds, instead of landing in one at random and making every
    first write of a page a full-page image there. Every window (pgbench's too) starts alike."""
    with admin_connect(url) as conn:
        conn.execute("CHECKPOINT")


class PgBench:
    """``pgbench``'s built-in TPC-B-like script (scale 10) against the server of ``url``, in its own
    database ``<name>_pgbench``: initialised once when entered, dropped on exit, run as often as
    asked (:meth:`run`). A benchmark brackets each figure it divides by pgbench's rate with a run
    before and one after it (:meth:`bracket`): on a shared machine the rate drifts by a tenth or
    more within a minute, so one run at the end would divide by another window's machine."""

    def __init__(self, url: str) -> None:
        if shutil.which("pgbench") is None:
            raise SystemExit("pgbench is not installed (apt-get install postgresql-client)")
        self.url = url
        self.name = dbname(url) + "_pgbench"
        parts = urlsplit(url)
        self.env = {
            **os.environ,
            "PGHOST": parts.hostname or "127.0.0.1",
            "PGPORT": str(parts.port or 5432),
            "PGUSER": parts.username or "postgres",
        }
        if parts.password:
            self.env["PGPASSWORD"] = parts.password
        #: Every run's tps, in order.
        self.runs: list[float] = []

    def __enter__(self) -> PgBench:
        self._drop()
        with admin_connect(self.url) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        subprocess.run(
            ["pgbench", "-i", "-q", "-s", "10", self.name], env=self.env, check=True, capture_output=True
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._drop()

    def _drop(self) -> None:
        with admin_connect(self.url) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(self.name)))

    def run(self, seconds: int, clients: int) -> float:
        """One run: ``clients`` clients and threads for ``seconds`` s after a ``CHECKPOINT``;
        its tps (without the connection time), also appended to :attr:`runs`."""
        checkpoint(self.url)
        done = subprocess.run(
            ["pgbench", "-c", str(clients), "-j", str(clients), "-T", str(seconds), self.name],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
        if match is None:
            raise SystemExit(f"could not read pgbench's tps from:\n{done.stdout}")
        tps = float(match.group(1))
        self.runs.append(tps)
        return tps

    @staticmethod
    def bracket(before: float, after: float) -> float:
        """The rate a figure measured between two runs is divided by: their mean (tps)."""
        return (before + after) / 2

    @staticmethod
    def unsteady(before: float, after: float, what: str) -> str | None:
        """A warning when the two runs around ``what`` differ by more than ``UNSTEADY`` of the larger
        (the machine changed speed inside the window, so its ratio says little), else None."""
        larger = max(before, after)
        apart = abs(before - after) / larger if larger > 0 else 0.0
        if apart <= UNSTEADY:
            return None
        return (
            f"warning: pgbench gave {before:.0f} tps before {what} and {after:.0f} after "
            f"({100 * apart:.1f} % apart): the machine changed speed "
            "inside this window; do not compare its ratios with another run's"
        )
