"""Row locks on runs — the only place runs are locked (global order: see workers/locks.py).

worker -> session -> run (by primary key) -> attempt -> lease. A run-scoped path (cancel,
retry scheduling) locks only its run; a worker-scoped path locks the worker first, then runs.
"""

from __future__ import annotations

import uuid

from qinglong.errors import DomainError

from .models import Run, RunAttempt


def lock_run(run_id: uuid.UUID) -> Run:
    """``SELECT … FOR UPDATE`` one run. Raises ``run_not_found``."""
    run = Run.objects.select_for_update(of=("self",)).filter(pk=run_id).first()
    if run is None:
        raise DomainError("run_not_found", "no such run")
    return run


def try_lock_candidate(attempt_id: uuid.UUID, *, run_version: int) -> RunAttempt | None:
    """Lock a queue candidate's run (``SKIP LOCKED``) if the run is still at ``run_version``, and
    read the whole attempt, its run and the run's pinned revision in the same statement.

    Returns None if another transaction holds the run, or changed it since the candidate page was
    read (every claim and cancel bumps the run's version), or the attempt is gone. The caller
    re-checks the attempt's state under the lock. Only the run row is locked (``FOR UPDATE OF``).
    """
    return (
        RunAttempt.objects.select_related("run__revision")
        .select_for_update(of=("run",), skip_locked=True)
        .filter(pk=attempt_id, run__version=run_version)
        .order_by()
        .first()
    )
