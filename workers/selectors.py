"""Reads about workers for operators: the live state each worker is in now (``docs/sessions.md``).

A worker's *live state* comes from its newest session (highest generation) and the database
clock, never from the administrative ``Worker.state`` alone: a worker whose session lease lapsed
is ``expired`` the moment it lapsed, before any sweep marks the session. Everything here reads.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

from .models import LIVE_SESSION_STATES, SessionState, Worker, WorkerSession, WorkerState

#: Live states, in the order the console shows them.
ONLINE, DRAINING, EXPIRED, OFFLINE, NEW, REVOKED = (
    "online",
    "draining",
    "expired",
    "offline",
    "new",
    "revoked",
)
LIVE_STATES = (ONLINE, DRAINING, EXPIRED, OFFLINE, NEW, REVOKED)
#: Newest-session columns annotated on a worker row (``session_<column>``).
SESSION_COLUMNS = (
    "id",
    "generation",
    "version",
    "state",
    "lease_expires_at",
    "registered_at",
    "max_concurrent_runs",
    "available_slots",
    "software_version",
)


def with_current_session(queryset: QuerySet[Worker]) -> QuerySet[Worker]:
    """Annotate each worker with its newest session's columns as ``session_<column>`` (None when
    it never registered): one indexed subquery per column (``session_generation_unique``)."""
    newest = WorkerSession.objects.filter(worker=OuterRef("pk")).order_by("-generation")
    return queryset.annotate(
        **{f"session_{column}": Subquery(newest.values(column)[:1]) for column in SESSION_COLUMNS}
    )


def live_state(
    *, worker_state: str, session_state: str | None, lease_expires_at: datetime | None, now: datetime
) -> str:
    """The live state of a worker from its administrative state and newest session at ``now``.

    ``revoked``; ``new`` (never registered); ``online`` or ``draining`` (a live session with an
    unexpired lease; draining when the session or the worker drains); ``expired`` (a live-state
    session whose lease lapsed, swept or not); ``offline`` (said goodbye, or fenced).
    """
    if worker_state == WorkerState.REVOKED:
        return REVOKED
    if session_state is None:
        return NEW
    if session_state in LIVE_SESSION_STATES:
        if lease_expires_at is None or lease_expires_at <= now:
            return EXPIRED
        if session_state == SessionState.DRAINING or worker_state == WorkerState.DRAINING:
            return DRAINING
        return ONLINE
    if session_state == SessionState.EXPIRED:
        return EXPIRED
    return OFFLINE


def live_state_filter(state: str, *, now: datetime) -> Q:
    """A ``Q`` over :func:`with_current_session` annotations selecting workers in live ``state``."""
    live = Q(session_state__in=LIVE_SESSION_STATES)
    fresh = Q(session_lease_expires_at__gt=now)
    not_revoked = ~Q(state=WorkerState.REVOKED)
    filters = {
        ONLINE: live & fresh & Q(session_state=SessionState.ONLINE, state=WorkerState.ACTIVE),
        DRAINING: live & fresh & (Q(session_state=SessionState.DRAINING) | Q(state=WorkerState.DRAINING)),
        EXPIRED: (live & ~fresh) | Q(session_state=SessionState.EXPIRED),
        OFFLINE: Q(session_state__in=(SessionState.OFFLINE, SessionState.FENCED)),
        NEW: Q(session_state__isnull=True),
    }
    if state == REVOKED:
        return Q(state=WorkerState.REVOKED)
    return not_revoked & filters[state]


def fleet_counts(*, now: datetime) -> dict[str, Any]:
    """How many workers are in each live state at ``now`` (the database clock): one aggregate
    query over the workers table with the newest-session subqueries."""
    queryset = with_current_session(Worker.objects.all())
    return queryset.aggregate(
        **{state: Count("pk", filter=live_state_filter(state, now=now)) for state in LIVE_STATES}
    )
