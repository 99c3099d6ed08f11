"""Real races for the lease suite: each contender runs on its own thread with its own database
connection, all released at once by a barrier; exceptions are collected, never swallowed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


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
