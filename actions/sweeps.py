"""One dispatch/sweep cycle: the periodic work of the control plane (ADR-0012 §3, §4).

Called by Celery beat (``qinglong.tasks.sweep_cycle``, cluster profile), by ``manage.py sweep``
and by the in-process loop of ``manage.py serve`` (standalone profile). Every step is a bounded
batch of single-item transactions whose writes re-check their preconditions, so any number of
cycles may run at once on any number of replicas.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from django.db import close_old_connections

from actions.leases.expiry import sweep_expired_leases, sweep_stranded_attempts
from actions.logs import sweep_log_compaction, sweep_output_retention
from actions.placement import refresh_placement_summaries
from actions.runs import sweep_due_retries
from actions.schedules import sweep_due_schedules
from actions.sessions.expiry import sweep_expired_sessions
from audit.marks import sweep_mark_record
from core.conf import protocol
from core.db import write_path
from core.dependencies import dependency_error
from core.errors import DomainError
from core.metrics import sweep_observe
from workers.nonces import nonces_prune

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CycleReport:
    sessions_expired: int
    leases_settled: int
    retries_queued: int
    schedule_fires: int
    summaries_changed: int
    nonces_pruned: int = 0
    logs_compacted: int = 0
    outputs_expired: int = 0
    stranded_settled: int = 0

    def any(self) -> bool:
        """Whether the cycle changed anything worth a log line (pruned nonces are routine)."""
        return any(value for kind, value in asdict(self).items() if kind != "nonces_pruned")


def _step(name: str, sweep: Callable[[], int]) -> int:
    """One step of the cycle; a transient refusal (lock timeout, busy store) skips only this step."""
    try:
        return sweep()
    except DomainError as exc:
        if exc.code not in ("lock_timeout", "storage_busy"):
            raise
        log.warning("sweep step %s skipped this cycle: %s", name, exc.code)
        return 0


@write_path
def sweep_finish(*, duration_seconds: float) -> int:
    """Prune up to one batch of expired replay nonces and stamp the cycle's end (``SweepMark``,
    read by ``/readyz``); one transaction. Returns the nonces pruned."""
    pruned = nonces_prune(batch=protocol().sweep_batch * 16)
    sweep_mark_record(duration_seconds=duration_seconds)
    return pruned


def run_cycle() -> CycleReport:
    """Expire lapsed sessions, settle lapsed leases and stranded attempts, queue due retries, admit
    due schedule fires (``docs/schedules.md``), refresh pending summaries, compact the logs of
    ended attempts and delete expired logs and artifacts (``docs/logs.md``), prune expired replay
    nonces, then record the cycle (``/readyz``, ``/metrics``).

    Each step is a bounded batch of single-item transactions (``QINGLONG_SWEEP_BATCH``) whose
    writes re-check their preconditions in their own ``UPDATE … WHERE``; a step that meets a lock
    timeout leaves its work for the next cycle without stopping the other steps. Returns counts.
    """
    started = time.monotonic()
    sessions_expired = _step("sessions", sweep_expired_sessions)
    leases_settled = _step("leases", sweep_expired_leases)
    stranded_settled = _step("stranded", sweep_stranded_attempts)
    retries_queued = _step("retries", sweep_due_retries)
    schedule_fires = _step("schedules", sweep_due_schedules)
    summaries_changed = _step("summaries", refresh_placement_summaries)
    logs_compacted = _step("log compaction", lambda: sweep_log_compaction(protocol().sweep_batch))
    outputs_expired = _step("output retention", lambda: sweep_output_retention(protocol().sweep_batch))
    nonces_pruned = _step("nonces", lambda: sweep_finish(duration_seconds=time.monotonic() - started))
    report = CycleReport(
        sessions_expired=sessions_expired,
        leases_settled=leases_settled,
        retries_queued=retries_queued,
        schedule_fires=schedule_fires,
        summaries_changed=summaries_changed,
        nonces_pruned=nonces_pruned,
        logs_compacted=logs_compacted,
        outputs_expired=outputs_expired,
        stranded_settled=stranded_settled,
    )
    sweep_observe(seconds=time.monotonic() - started, items=asdict(report))
    if report.any():
        log.info("sweep cycle: %s", asdict(report))
    return report


def loop(stop: threading.Event, interval_seconds: float) -> None:
    """Run cycles every ``interval_seconds`` until ``stop`` is set (one thread, no overlap)."""
    while not stop.is_set():
        try:
            run_cycle()
        except Exception as exc:  # keep sweeping: one bad cycle must not stop lease expiry for good
            if dependency_error(exc) is None:  # an outage is one line (core.dependencies), not one per cycle
                log.exception("sweep cycle failed")
        finally:
            close_old_connections()
        stop.wait(interval_seconds)
