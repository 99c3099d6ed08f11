"""Reads for runs: lookups by name, the dispatch queue (keyset), run detail for the APIs."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from qinglong.errors import DomainError

from .models import RunAttempt, Task, TaskRevision
from .states import AttemptState

#: Candidate attempts per keyset page (ADR-0012 §4, SIBLINGS §4: hard cap 64).
QUEUE_PAGE = 64


def task_by_name(name: str) -> Task:
    """The task named ``name``; raises ``task_not_found``."""
    task = Task.objects.filter(name=name).first()
    if task is None:
        raise DomainError("task_not_found", f"no task named {name!r}", field="task")
    return task


def latest_revision(task: Task) -> TaskRevision:
    """The newest revision of ``task`` (every task has revision 1)."""
    return task.revisions.order_by("-number").first()


QueueCursor = tuple[int, datetime, object]


def dispatch_queue_page(*, now: datetime, after: QueueCursor | None = None,
                        size: int = QUEUE_PAGE) -> list[RunAttempt]:
    """One page of attempts awaiting a run lease, in dispatch order (priority desc, FIFO, id).

    Served by the partial index ``attempt_dispatch_queue`` (state = claimed), so a page costs the
    same with 100 or 100,000 waiting attempts. An attempt whose lease is still live is skipped;
    one whose unstarted lease lapsed is included (the claim takes it over). Runs with a
    cancellation request are excluded. ``after`` is the (priority, ready_at, id) of the last row
    of the previous page.
    """
    queryset: QuerySet[RunAttempt] = (
        RunAttempt.objects.filter(state=AttemptState.CLAIMED)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .filter(run__cancel_requested_at__isnull=True)
    )
    if after is not None:
        priority, ready_at, attempt_id = after
        queryset = queryset.filter(
            Q(priority__lt=priority)
            | Q(priority=priority, ready_at__gt=ready_at)
            | Q(priority=priority, ready_at=ready_at, id__gt=attempt_id)
        )
    return list(
        queryset.select_related("run", "run__revision", "run__task").order_by("-priority", "ready_at", "id")[
            : min(size, QUEUE_PAGE)
        ]
    )
