"""Placement write path: refresh the mismatch summary of runs that wait (ADR-0012 §4).

Runs each dispatch cycle (the sweep loop / Celery beat). For a bounded batch of waiting attempts
(oldest first) it computes {category: live workers} against the live workers and stores it on
the run only when it changed, so a steady backlog costs reads, not writes. Summaries hold
category counts only — never labels, commands or other content.
"""

from __future__ import annotations

from django.db.models import Q

from qinglong.conf import protocol
from qinglong.db import db_now, write_path
from runs.models import Run, RunAttempt
from runs.states import AttemptState, RunState

from .selectors import live_workers, mismatch_summary, parse_placement

#: Waiting attempts examined per cycle.
SUMMARY_BATCH = 64


@write_path
def refresh_placement_summaries(*, batch: int = SUMMARY_BATCH) -> int:
    """Recompute the mismatch summaries of up to ``batch`` waiting runs; return how many changed.

    A run whose attempt can be placed right now gets an empty summary (``{}``); the CAS only
    touches runs still ``queued``/``dispatching``.
    """
    now = db_now()
    waiting = list(
        RunAttempt.objects.filter(state=AttemptState.CLAIMED, run__cancel_requested_at__isnull=True)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .select_related("run__revision")
        .order_by("-priority", "ready_at", "id")[: min(batch, protocol().sweep_batch)]
    )
    if not waiting:
        return 0
    workers = live_workers(now=now)
    changed = 0
    for attempt in waiting:
        revision = attempt.run.revision
        summary = mismatch_summary(parse_placement(revision.placement_sha256, revision.placement), workers)
        if summary == attempt.run.placement_summary:
            continue
        changed += Run.objects.filter(
            pk=attempt.run_id, state__in=(RunState.QUEUED, RunState.DISPATCHING)
        ).update(placement_summary=summary, placement_checked_at=now)
    return changed
