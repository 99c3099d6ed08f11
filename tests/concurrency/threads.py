"""Real races for the lease suite: each contender runs on its own thread with its own database
connection, all released at once by a barrier; exceptions are collected, never swallowed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction

from workers.models import Worker


def waits_on_a_lock(pid: int) -> bool:
    """True while the backend ``pid`` waits for a lock (``pg_stat_activity``), read on this
    thread's own connection, in autocommit (inside a transaction the view would not change)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def libpq_params() -> dict[str, Any]:
    """The default database's connection parameters for a plain ``psycopg.connect`` (a connection
    Django does not manage, e.g. one that holds a row lock from another thread)."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool"):
        params.pop(key, None)
    return params


def race(*contenders: Callable[[], Any], timeout: float = 60) -> list[tuple[str, Any]]:
    """Run the callables at the same instant; return ``("ok", value)`` or ``("error", exc)`` each."""
    barrier = threading.Barrier(len(contenders))
    results: list[tuple[str, Any] | None] = [None] * len(contenders)

    def run(index: int, contender: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout)
            results[index] = ("ok", contender())
        except Exception as exc:  # returned to the test, which asserts on it
            results[index] = ("error", exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a contender hung"
    return results  # type: ignore[return-value]


class LockHolder(threading.Thread):
    """Holds ``SELECT … FOR UPDATE`` on a worker row until ``release`` is set. On SQLite the
    transaction begins IMMEDIATE (settings), so it holds the database's write lock instead."""

    def __init__(self, worker_id) -> None:
        super().__init__(daemon=True)
        self.worker_id = worker_id
        self.locked = threading.Event()
        self.release = threading.Event()
        self.released_at = 0.0

    def run(self) -> None:
        try:
            with transaction.atomic():
                Worker.objects.select_for_update().get(pk=self.worker_id)
                self.locked.set()
                self.release.wait(30)
                self.released_at = time.monotonic()
        finally:
            connection.close()
