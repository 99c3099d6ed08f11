"""Placement write path: the mismatch summary of runs that wait (ADR-0012 §4, docs/placement.md §6).

Each dispatch cycle (``actions.sweeps.run_cycle``: the in-process loop, ``manage.py sweep`` or
Celery beat) calls :func:`refresh_placement_summaries`. It reads a bounded window of the dispatch
queue — the attempts waiting for a run lease, in dispatch order, continuing from where the
previous cycle stopped so that a long backlog is covered in turn — computes, once per distinct
placement, ``{category: live workers}`` against the live workers, and writes a run's summary
only when it changed, so a steady backlog costs reads, not writes. The computation runs outside
any transaction; the writes are one short transaction (:func:`placement_summaries_store`).

A summary is ``None`` when a live worker could take the run now, ``{}`` when no worker is live,
draining or expired, and otherwise category counts such as ``{"arch": 3, "capacity": 2,
"draining": 1}`` — every failing category of every live worker, plus the draining and expired
workers that are no candidates at all. Summaries,
the ``run.placement_pending`` event and log lines hold category names and counts only — never
labels, values, runtimes, commands or anything else a worker or an operator wrote.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.core.cache import cache
from django.db.models import Q

from audit.models import ActorType
from audit.recorder import record
from core.conf import protocol
from core.db import db_now, write_path
from placement.selectors import (
    describe_summary,
    live_workers,
    mismatch_summary,
    parse_placement,
    unavailable_workers,
)
from runs.locks import try_lock_run
from runs.models import Run, RunAttempt
from runs.selectors import QUEUE_PAGE, dispatch_queue_page
from runs.states import AttemptState, RunState

log = logging.getLogger(__name__)

#: Waiting attempts examined per cycle, in multiples of ``QINGLONG_SWEEP_BATCH`` (default 64):
#: mostly reads, so four times what a sweep settles.
SUMMARY_BATCH_FACTOR = 4
#: Where the next cycle resumes the queue window (the cache is shared by replicas in a cluster;
#: losing it only restarts the window at the head of the queue).
_CURSOR_KEY = "placement:summary-cursor"


@dataclass(frozen=True)
class SummaryChange:
    """A summary to write: the run, what the cycle read, and the new summary."""

    run_id: uuid.UUID
    before: dict[str, int] | None
    before_checked_at: datetime | None
    after: dict[str, int] | None


def _waiting_window(now: datetime, batch: int) -> list[RunAttempt]:
    start = cache.get(_CURSOR_KEY)
    cursor = start
    waiting: list[RunAttempt] = []
    while len(waiting) < batch:
        size = min(QUEUE_PAGE, batch - len(waiting))
        page = dispatch_queue_page(now=now, after=cursor, size=size)
        if not page and not waiting and cursor is not None:
            cursor = None  # the previous window ended exactly at the tail: wrap to the head
            continue
        waiting.extend(page)
        if len(page) < size:
            cursor = None  # reached the tail: the next cycle starts at the head again
            break
        last = page[-1]
        cursor = (last.priority, last.ready_at, last.pk)
    if cursor != start:
        cache.set(_CURSOR_KEY, cursor, timeout=None)
    return waiting


def refresh_placement_summaries(*, batch: int | None = None) -> int:
    """Recompute the mismatch summaries of up to ``batch`` waiting runs; return how many changed.

    ``batch``: waiting attempts examined this cycle (default 4 × ``QINGLONG_SWEEP_BATCH`` = 256), in
    dispatch order from where the previous cycle stopped. Reads: the queue window and the live
    workers (≤ 1,024, one query). Writes (via :func:`placement_summaries_store`, one transaction)
    only the runs whose summary changed. Safe on several replicas at once: each write is a
    compare-and-swap. Raises ``storage_busy``/``lock_timeout`` from the store; nothing else.
    ADR-0012 §4.
    """
    now = db_now()
    waiting = _waiting_window(now, max(1, batch or SUMMARY_BATCH_FACTOR * protocol().sweep_batch))
    if not waiting:
        return 0
    workers = live_workers(now=now)
    unavailable = unavailable_workers(now=now)
    by_placement: dict[str, dict[str, int] | None] = {}
    changes = []
    for attempt in waiting:
        run = attempt.run
        revision = run.revision
        if revision.placement_sha256 not in by_placement:
            placement = parse_placement(revision.placement_sha256, revision.placement)
            summary = mismatch_summary(placement, workers)
            by_placement[revision.placement_sha256] = None if summary is None else {**summary, **unavailable}
        summary = by_placement[revision.placement_sha256]
        if summary != run.placement_summary:
            changes.append(SummaryChange(run.pk, run.placement_summary, run.placement_checked_at, summary))
    if not changes:
        return 0
    return placement_summaries_store(changes=changes, checked_at=now)


def _still_waiting(run: Run, now: datetime) -> bool:
    if run.state not in (RunState.QUEUED, RunState.DISPATCHING) or run.cancel_requested_at is not None:
        return False
    return (
        RunAttempt.objects.filter(run_id=run.pk, state=AttemptState.CLAIMED)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .exists()
    )


@write_path
def placement_summaries_store(*, changes: list[SummaryChange], checked_at: datetime) -> int:
    """Write new mismatch summaries computed at ``checked_at`` (DB time); return how many landed.

    ``changes``: one :class:`SummaryChange` per run. For each run (by primary key) it takes the
    run's row lock without waiting (``runs.locks.try_lock_run``: a run a claim holds is skipped
    and looked at again next cycle), then compare-and-swaps ``placement_summary`` and
    ``placement_checked_at`` if the run still waits for a lease and nobody wrote a summary since
    the cycle read it. When the set of categories changes to a new pending one it appends a
    ``run.placement_pending`` event holding ``{category: count}`` only, and logs the same.
    One transaction (ADR-0012 §4). Raises ``storage_busy``/``lock_timeout``.
    """
    now = db_now()
    landed = 0
    for change in sorted(changes, key=lambda c: c.run_id):
        run = try_lock_run(change.run_id)
        if run is None or not _still_waiting(run, now):
            continue
        updated = Run.objects.filter(
            pk=run.pk,
            placement_checked_at=change.before_checked_at,
        ).update(placement_summary=change.after, placement_checked_at=checked_at)
        if not updated:
            continue  # another cycle wrote a summary after this one read it
        landed += 1
        before_categories = None if change.before is None else set(change.before)
        if change.after is not None and set(change.after) != before_categories:
            record(
                "run.placement_pending",
                actor_type=ActorType.SYSTEM,
                run_id=run.pk,
                data={"summary": change.after},
            )
            log.info("run %s waits for placement: %s", run.pk, describe_summary(change.after))
    return landed
