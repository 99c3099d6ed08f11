"""The control plane's liveness beat (docs/leases.md, Outages; ``audit.liveness``).

``manage.py serve`` runs :func:`beat_loop` in one background thread of every replica: every
``LIVENESS_BEAT_SECONDS`` it checks that this replica can serve — its cache answers (cluster
profile) — and beats the shared row on the database clock. A replica whose database or cache is
unreachable does not beat, so when no replica can serve, the beats stop; the expiry sweeps then
settle nothing that lapsed since, and after the first beat that ends the gap they wait out a grace
window before settling what lapsed during it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

from django.core.cache import cache
from django.db import close_old_connections

from audit.liveness import liveness_beat_record
from core.conf import is_cluster
from core.db import db_now, write_path
from core.dependencies import dependency_error, note_recovery

log = logging.getLogger(__name__)


@write_path
def liveness_beat() -> bool:
    """Beat the liveness row at the database clock (one transaction); True if it ended an outage."""
    return liveness_beat_record(now=db_now())


def _cache_answers() -> None:
    """Round-trip the shared cache (cluster profile); raises what the cache client raises."""
    key = f"liveness-probe:{uuid.uuid4().hex}"
    cache.set(key, 1, timeout=5)
    cache.delete(key)


def beat_once() -> bool:
    """Probe the dependencies and beat; False when this replica cannot serve now (nothing beaten).

    A failure is noted once per state change (``core.dependencies``), never raised."""
    try:
        if is_cluster():
            _cache_answers()
            note_recovery("cache")
        ended_outage = liveness_beat()
        note_recovery("database")
    except Exception as exc:  # any failure means: do not beat; the gap tells the sweeps
        if dependency_error(exc) is None:
            log.warning("liveness beat failed: %s: %s", type(exc).__name__, exc)
        return False
    finally:
        close_old_connections()
    if ended_outage:  # a restart is one too: routine, so INFO (the dependency lines are WARNINGs)
        log.info(
            "the control plane serves again after an outage: lapses during it are excused for a grace window"
        )
    return True


def beat_loop(
    stop: threading.Event, interval_seconds: float, serving: Callable[[], bool] = lambda: True
) -> None:
    """Beat every ``interval_seconds`` until ``stop`` is set (one thread per serving process).

    ``serving()`` False — the server was told to shut down and no longer takes requests — stops
    the beats at once, so a replica that is going away is not counted as serving meanwhile."""
    while not stop.is_set():
        if serving():
            beat_once()
        stop.wait(interval_seconds)
