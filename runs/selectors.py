"""Reads for runs: lookups by name, the dispatch queue (keyset), run detail for the APIs."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.db.models import Q, QuerySet

from core.errors import DomainError

from .models import RunAttempt, Task, TaskRevision
from .states import AttemptState

#: Candidate attempts per keyset page (ADR-0012 §4, docs/placement.md §5: hard cap 64).
QUEUE_PAGE = 64


def task_by_name(name: str) -> Task:
    """The task named ``name``; raises ``task_not_found``."""
    task = Task.objects.filter(name=name).first()
    if task is None:
        raise DomainError("task_not_found", f"no task named {name!r}", field="task")
    return task


def latest_revision(task: Task) -> TaskRevision:
    """The newest revision of ``task`` (every task has revision 1)."""
    return task.revisions.latest("number")


QueueCursor = tuple[int, datetime, object]

#: What a candidate row carries: its queue position and state, its run's version (a claim locks
#: the run only if it is still at that version) and its run's pinned placement.
#: Nothing large (commands, env, output tails) — a claim loads the revision of the one attempt it
#: actually claims, under that run's row lock.
CANDIDATE_FIELDS = (
    "id",
    "run_id",
    "state",
    "priority",
    "ready_at",
    "lease_expires_at",
    "lease_generation",
    "placement_sha256",
    "run__id",
    "run__version",
    "run__revision",
    "run__revision__placement",
    "run__revision__placement_sha256",
)


def dispatch_queue_queryset(*, now: datetime, after: QueueCursor | None = None) -> QuerySet[RunAttempt]:
    """The dispatch queue as a queryset, in dispatch order (see :func:`dispatch_queue_page`)."""
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
    return (
        queryset.select_related("run__revision")
        .only(*CANDIDATE_FIELDS)
        .order_by("-priority", "ready_at", "id")
    )


def dispatch_queue_page(
    *, now: datetime, after: QueueCursor | None = None, size: int = QUEUE_PAGE
) -> list[RunAttempt]:
    """One page of attempts awaiting a run lease, in dispatch order (priority desc, FIFO, id).

    ``now`` is the database clock; ``after`` the (priority, ready_at, id) of the last row of the
    previous page (keyset pagination, never OFFSET); ``size`` is capped at 64 (ADR-0012 §4,
    docs/placement.md §5). Served by the partial index ``attempt_dispatch_queue`` (state = claimed), so
    a page costs the same with 100 or 100,000 waiting attempts (``bench/claim.py`` prints the
    plan). An attempt whose lease is still live is skipped; one whose unstarted lease lapsed is
    included (the claim takes it over). Runs with a cancellation request are excluded. A row
    here is a candidate, never a claim: the claim re-checks it under the run's row lock.
    """
    return list(dispatch_queue_queryset(now=now, after=after)[: min(size, QUEUE_PAGE)])


#: Placement classes one claim looks at (found by a loose index scan from a random point).
MAX_PLACEMENT_CLASSES = 256

_CLASSES_SQL = """
WITH RECURSIVE classes(sha) AS (
    SELECT MIN(placement_sha256) FROM {table} WHERE state = %s AND placement_sha256 >= %s
  UNION ALL
    SELECT (SELECT MIN(placement_sha256) FROM {table} WHERE state = %s AND placement_sha256 > classes.sha)
    FROM classes WHERE classes.sha IS NOT NULL
)
SELECT sha FROM classes WHERE sha IS NOT NULL LIMIT %s
"""


def waiting_placement_classes(*, start: str = "", limit: int | None = None) -> list[str]:
    """Placement digests of attempts awaiting (or holding) a run lease, from ``start`` on, wrapping.

    A loose index scan over ``attempt_dispatch_by_placement``: one index probe per class found,
    so its cost grows with the number of distinct placements waiting, never with the number of
    waiting attempts. ``start`` (a hex prefix) rotates which classes come first when there are
    more than ``limit`` — callers pass a random one so that every class is reached in turn.
    """
    limit = MAX_PLACEMENT_CLASSES if limit is None else limit
    sql = _CLASSES_SQL.format(table=connection.ops.quote_name(RunAttempt._meta.db_table))
    found: list[str] = []
    with connection.cursor() as cursor:
        for lower in (start, ""):
            cursor.execute(sql, [AttemptState.CLAIMED, lower, AttemptState.CLAIMED, limit - len(found)])
            found += [sha for (sha,) in cursor.fetchall() if sha not in found]
            if not start or len(found) >= limit:
                break
    return found[:limit]


def placement_class_heads(
    *, now: datetime, classes: list[str], size: int, after: QueueCursor | None = None
) -> list[RunAttempt]:
    """The first ``size`` claimable attempts of each placement class, merged in dispatch order.

    One index probe per class (``attempt_dispatch_by_placement``: the queue ordered within each
    class), each reading at most ``size`` rows past ``after``; the merged list keeps at most
    ``size`` rows. Filters as :func:`dispatch_queue_page` (claimable, not cancel-requested).
    """
    size = min(size, QUEUE_PAGE)
    heads: list[RunAttempt] = []
    for placement in classes:
        heads += list(dispatch_queue_queryset(now=now, after=after).filter(placement_sha256=placement)[:size])
    heads.sort(key=lambda a: (-a.priority, a.ready_at, a.pk))
    return heads[:size]
