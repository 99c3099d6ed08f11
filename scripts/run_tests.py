"""`make test`: the whole suite on SQLite, then on PostgreSQL.

The SQLite leg runs everything. The PostgreSQL leg runs every database test again against a real
server (``--pg-url``, default postgres://postgres@127.0.0.1:5432/qinglong); tests that need no
database (protocol, agent internals) run once. If PostgreSQL cannot be reached the leg is skipped
with a loud message — except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
#: Test folders that touch no database: run once, in the SQLite leg.
NO_DB = ["tests/protocol", "tests/agent/unit", "tests/deploy"]
#: Browser tests drive the console's pages; the write paths and queries behind those pages run
#: on both stores in tests/console and tests/accounts. Run once, in the SQLite leg.
UI_ONLY = ["tests/browser"]
#: pytest's exit status when a selection holds no test (a leg whose paths hold no ``solo`` test).
NO_TESTS_COLLECTED = 5


def postgres_reachable(url: str) -> str | None:
    """None if a connection to the server works, else the error text."""
    parts = urlsplit(url)
    try:
        with psycopg.connect(
            host=parts.hostname,
            port=parts.port or 5432,
            user=parts.username or "postgres",
            password=parts.password or None,
            dbname="postgres",
            connect_timeout=5,
        ):
            return None
    except psycopg.Error as exc:
        return str(exc).strip()


def pytest(env: dict[str, str], extra: list[str]) -> int:
    """One leg: every test but the ``solo`` ones on the xdist workers, then the ``solo`` ones alone
    (throughput-bound tests with real processes, which a neighbouring test would starve)."""
    workers = os.environ.get("QINGLONG_TEST_WORKERS", "2")
    command = [sys.executable, "-m", "pytest", "--timeout", "600", *extra]
    started = time.monotonic()
    if any(arg == "-m" or arg.startswith("-m") and len(arg) > 2 for arg in extra):
        status = subprocess.call([*command, "-n", workers, "--dist", "loadgroup"], cwd=ROOT, env=env)
    else:
        status = subprocess.call(
            [*command, "-n", workers, "--dist", "loadgroup", "-m", "not solo"], cwd=ROOT, env=env
        )
        alone = subprocess.call([*command, "-n", "0", "-m", "solo"], cwd=ROOT, env=env)
        status = max(status, 0 if alone == NO_TESTS_COLLECTED else alone)
    print(
        f"[make test] leg {env['QINGLONG_TEST_LEG']}: exit {status} in {time.monotonic() - started:.0f}s",
        flush=True,
    )
    return status


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/qinglong")
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    args, extra = parser.parse_known_args()
    ci = os.environ.get("CI", "").lower() == "true"
    base = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    base.pop("DATABASE_URL", None)
    statuses = []
    if args.only in (None, "sqlite"):
        statuses.append(pytest({**base, "QINGLONG_TEST_LEG": "sqlite"}, extra))
    if args.only in (None, "postgres"):
        problem = postgres_reachable(args.pg_url)
        if problem is not None:
            print(f"[make test] PostgreSQL at {args.pg_url} is unreachable: {problem}", flush=True)
            if ci:
                print("[make test] CI=true: a PostgreSQL leg that cannot connect fails", flush=True)
                return 1
            print("[make test] SKIPPING the PostgreSQL leg (set CI=true to make this an error)", flush=True)
        else:
            env = {**base, "QINGLONG_TEST_LEG": "postgres", "DATABASE_URL": args.pg_url}
            statuses.append(pytest(env, [*extra, *[f"--ignore={path}" for path in [*NO_DB, *UI_ONLY]]]))
    return max(statuses, default=0)


if __name__ == "__main__":
    sys.exit(main())
