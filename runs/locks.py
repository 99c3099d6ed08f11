"""Row locks on runs — the only place runs are locked (global order: see workers/locks.py).

worker -> session -> run (by primary key) -> attempt -> lease. A run-scoped path (cancel,
retry scheduling) locks only its run; a worker-scoped path locks the worker first, then runs.
"""

from __future__ import annotations

import uuid

from qinglong.errors import DomainError

from .models import Run


def lock_run(run_id: uuid.UUID) -> Run:
    """``SELECT … FOR UPDATE`` one run. Raises ``run_not_found``."""
    run = Run.objects.select_for_update(of=("self",)).filter(pk=run_id).first()
    if run is None:
        raise DomainError("run_not_found", "no such run")
    return run


def try_lock_run(run_id: uuid.UUID, *, version: int | None = None) -> Run | None:
    """Lock one run unless another transaction holds it (``SKIP LOCKED``); None if skipped/gone.

    Used by claims so that concurrent claimers move on to the next candidate instead of queueing
    behind each other (PostgreSQL; on SQLite writers are already serialised). With ``version``
    the row is locked only if it is still at that version — PostgreSQL re-checks the condition
    on the newest row version after the lock — so a claimer never holds (and makes everyone else
    skip) a run that another claim or a cancel changed since the claimer's candidate page was read.
    """
    queryset = Run.objects.select_for_update(of=("self",), skip_locked=True).filter(pk=run_id)
    if version is not None:
        queryset = queryset.filter(version=version)
    return queryset.first()
