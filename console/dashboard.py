"""The console's landing figures: fleet health and the run queue at a glance (reads only).

Every figure is one cheap query that an index serves or that is bounded by the fleet size, so
the page stays fast however long the backlog: run counts use ``run_state_cancel`` (state only,
terminal runs excluded), waiting reasons look at the head of the dispatch queue only
(``attempt_dispatch_queue``, at most :data:`REASON_WINDOW` attempts), failures and claims count
events through ``event_kind_time``, capacity counts active leases through ``lease_active_expiry``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib.metadata import PackageNotFoundError, version
from urllib.parse import urlencode

from django.db.models import Count, Q, Subquery, Sum
from django.urls import reverse

from audit.models import Event
from leases.models import LeaseState, RunDispatchLease
from placement.matching import SUMMARY_CATEGORIES
from runs.models import Run, RunAttempt
from runs.states import AttemptState, RunState
from workers.models import LIVE_SESSION_STATES, WorkerSession
from workers.selectors import LIVE_STATES, fleet_counts

#: Waiting attempts (from the head of the dispatch queue) whose reasons the dashboard tallies.
REASON_WINDOW = 500
FAILURE_KINDS = ("attempt.failed", "attempt.timed_out")
LOST_KINDS = ("attempt.lost",)


def expected_agent_version() -> str:
    """The ``softwareVersion`` an up-to-date agent reports: ``qinglong-worker/<package version>``."""
    try:
        return f"qinglong-worker/{version('qinglong-control-plane')}"
    except PackageNotFoundError:  # a source tree that was never installed
        return ""


@dataclass
class Figure:
    """One number on the dashboard, what it counts, and the list that shows those rows."""

    label: str
    value: int | str
    url: str
    hint: str = ""
    tone: str = ""


@dataclass
class Dashboard:
    """Figures grouped as the page shows them."""

    workers: list[Figure] = field(default_factory=list)
    capacity: Figure | None = None
    runs: list[Figure] = field(default_factory=list)
    reasons: list[Figure] = field(default_factory=list)
    waiting_seen: int = 0
    health: list[Figure] = field(default_factory=list)
    oldest: Figure | None = None


def _url(name: str, **query: str) -> str:
    path = reverse(name)
    return f"{path}?{urlencode(query)}" if query else path


def _age(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def build(*, now: datetime) -> Dashboard:
    """Every figure at ``now`` (the database clock). Nine queries, none growing with the backlog."""
    board = Dashboard()
    workers_url = "admin:workers_worker_changelist"
    fleet = fleet_counts(now=now)
    for state in LIVE_STATES:
        tone = {"online": "good", "expired": "bad", "draining": "warn"}.get(state, "")
        board.workers.append(Figure(state, fleet[state], _url(workers_url, live=state), tone=tone))

    live = WorkerSession.objects.filter(state__in=LIVE_SESSION_STATES, lease_expires_at__gt=now)
    expected = expected_agent_version()
    totals = live.aggregate(
        slots=Sum("max_concurrent_runs"),
        outdated=Count("pk", filter=~Q(software_version=expected))
        if expected
        else Count("pk", filter=Q(pk=None)),
    )
    board.workers.append(
        Figure(
            "outdated",
            totals["outdated"],
            _url(workers_url, live="outdated"),
            hint=f"live, not {expected}" if expected else "",
            tone="warn" if totals["outdated"] else "",
        )
    )
    used = RunDispatchLease.objects.filter(state=LeaseState.LEASED).count()
    board.capacity = Figure(
        "capacity used / total",
        f"{used} / {totals['slots'] or 0}",
        _url("admin:leases_rundispatchlease_changelist", state__exact=LeaseState.LEASED),
        hint="active run leases / slots of live sessions",
    )

    by_state = dict(
        Run.objects.filter(
            state__in=(RunState.QUEUED, RunState.DISPATCHING, RunState.RUNNING, RunState.RETRY_WAIT)
        )
        .values_list("state")
        .annotate(n=Count("pk"))
        .values_list("state", "n")
    )
    runs_url = "admin:runs_run_changelist"
    for state, label in (
        (RunState.QUEUED, "queued"),
        (RunState.DISPATCHING, "dispatching"),
        (RunState.RUNNING, "running"),
        (RunState.RETRY_WAIT, "retry waiting"),
    ):
        board.runs.append(Figure(label, by_state.get(state, 0), _url(runs_url, state__exact=state)))

    # The queue head by its own index first, then those runs by primary key (a join planned
    # the other way round scans every run).
    head_ids = (
        RunAttempt.objects.filter(state=AttemptState.CLAIMED)
        .order_by("-priority", "ready_at", "id")
        .values("run_id")[:REASON_WINDOW]
    )
    head = list(Run.objects.filter(pk__in=Subquery(head_ids)).values_list("placement_summary", flat=True))
    board.waiting_seen = len(head)
    reasons: Counter[str] = Counter()
    for summary in head:
        if summary is not None:
            reasons.update(summary.keys() if summary else ["no live worker"])
    for reason, count in reasons.most_common(5):
        if reason in SUMMARY_CATEGORIES or reason == "no live worker":
            key = "none" if reason == "no live worker" else reason
            board.reasons.append(Figure(reason, count, _url(runs_url, waiting=key)))

    hour, day = now - timedelta(hours=1), now - timedelta(days=1)
    events = Event.objects.filter(
        kind__in=(*FAILURE_KINDS, *LOST_KINDS, "lease.claimed"), created_at__gte=day
    ).aggregate(
        failed_hour=Count("pk", filter=Q(kind__in=FAILURE_KINDS, created_at__gte=hour)),
        failed_day=Count("pk", filter=Q(kind__in=FAILURE_KINDS)),
        lost_hour=Count("pk", filter=Q(kind__in=LOST_KINDS, created_at__gte=hour)),
        lost_day=Count("pk", filter=Q(kind__in=LOST_KINDS)),
        claims=Count("pk", filter=Q(kind="lease.claimed", created_at__gte=now - timedelta(minutes=5))),
    )
    events_url = "admin:audit_event_changelist"
    since_hour, since_day = hour.isoformat(sep=" "), day.isoformat(sep=" ")
    failures = ",".join(FAILURE_KINDS)
    board.health = [
        Figure(
            "failures, last hour",
            events["failed_hour"],
            _url(events_url, kind__in=failures, created_at__gte=since_hour),
            tone="bad" if events["failed_hour"] else "",
        ),
        Figure(
            "failures, last day",
            events["failed_day"],
            _url(events_url, kind__in=failures, created_at__gte=since_day),
        ),
        Figure(
            "lost attempts, last hour",
            events["lost_hour"],
            _url(events_url, kind="attempt.lost", created_at__gte=since_hour),
            tone="bad" if events["lost_hour"] else "",
        ),
        Figure(
            "lost attempts, last day",
            events["lost_day"],
            _url(events_url, kind="attempt.lost", created_at__gte=since_day),
        ),
        Figure(
            "claims per minute",
            f"{events['claims'] / 5:.1f}",
            _url(events_url, kind="lease.claimed"),
            hint="over the last 5 minutes",
        ),
    ]

    oldest = (
        RunAttempt.objects.filter(state=AttemptState.CLAIMED)
        .order_by("ready_at")
        .values_list("run_id", "ready_at")
        .first()
    )
    if oldest is None:
        board.oldest = Figure(
            "oldest queued run", "none waiting", _url(runs_url, state__exact=RunState.QUEUED)
        )
    else:
        run_id, ready_at = oldest
        board.oldest = Figure(
            "oldest queued run",
            _age((now - ready_at).total_seconds()),
            reverse("admin:runs_run_change", args=[run_id]),
            hint="waiting for a run lease",
            tone="warn" if (now - ready_at).total_seconds() > 300 else "",
        )
    return board
