"""Row locks on tasks and runs — the only place they are locked (global order: see workers/locks.py).

worker -> session -> run (by primary key) -> attempt -> lease. A run-scoped path (cancel,
retry scheduling) locks only its run; a worker-scoped path locks the worker first, then runs.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Sequence
from functools import reduce

from django.db.models import Q

from core.errors import DomainError

from .models import Run, RunAttempt, Task


def lock_task(task_id: uuid.UUID) -> Task | None:
    """``SELECT … FOR UPDATE`` one task (a new revision numbers itself under it); None if absent."""
    return Task.objects.select_for_update(of=("self",)).filter(pk=task_id).first()


def lock_run(run_id: uuid.UUID) -> Run:
    """``SELECT … FOR UPDATE`` one run. Raises ``run_not_found``."""
    run = Run.objects.select_for_update(of=("self",)).filter(pk=run_id).first()
    if run is None:
        raise DomainError("run_not_found", "no such run")
    return run


def try_lock_run(run_id: uuid.UUID) -> Run | None:
    """Lock one run unless another transaction holds it (``SKIP LOCKED``); None if skipped or gone.

    For background writers (placement summaries) that must never queue behind a claim.
    """
    return Run.objects.select_for_update(of=("self",), skip_locked=True).filter(pk=run_id).first()


def lock_candidates(candidates: Sequence[RunAttempt], *, limit: int) -> list[RunAttempt]:
    """Lock the runs of up to ``limit`` queue candidates in one statement, in dispatch order.

    ``candidates`` are rows of a dispatch-queue page (``runs.selectors``), each with its run's
    version as the page saw it. ``SELECT … FOR UPDATE OF run SKIP LOCKED … LIMIT`` passes over a
    run another transaction holds, and — because PostgreSQL re-checks the condition on the newest
    row version after locking — over a run that changed since the page was read (every claim and
    cancel bumps the run's version); it never waits, and never locks a row it does not return.
    Returns the whole attempts with their runs and pinned revisions; the caller re-checks each
    attempt's state under the lock. On SQLite the write transaction already excludes everyone.
    """
    if not candidates or limit < 1:
        return []
    which = reduce(operator.or_, (Q(pk=c.pk, run__version=c.run.version) for c in candidates))
    return list(
        RunAttempt.objects.select_related("run__revision")
        .select_for_update(of=("run",), skip_locked=True)
        .filter(which)
        .order_by("-priority", "ready_at", "id")[:limit]
    )
