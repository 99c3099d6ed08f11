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


def pgbench_tps(url: str, seconds: int, clients: int) -> float:
    """``pgbench``'s built-in TPC-B-like script (scale 10, ``clients`` clients and threads) against
    the server of ``url``, in its own database ``<name>_pgbench``, created and dropped here."""
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
        checkpoint(url)
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
