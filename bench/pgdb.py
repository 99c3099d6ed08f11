"""PostgreSQL helpers shared by the benchmarks (they run as scripts: ``python bench/x.py``)."""

from __future__ import annotations

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
