"""Reads for the worker management API: workers with their live session, capacity in use and
active attempts (``docs/operators.md`` Worker management API). No locks, no writes."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, JSONField, OuterRef, Prefetch, Q, QuerySet
from django.db.models.functions import Cast

from core.conf import protocol
from core.errors import DomainError
from protocol import capabilities as caps
from workers.models import LIVE_SESSION_STATES, Worker, WorkerSession, WorkerState
from workers.versions import version_verdict

from .models import LeaseState, RunDispatchLease


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not caps.LABEL_KEY.match(key) or not caps.LABEL_VALUE.match(value):
        raise DomainError(
            "validation_failed", "must be KEY=VALUE with a valid label key and value", field="label"
        )
    return key, value


def live_sessions() -> QuerySet[WorkerSession]:
    """Online or draining sessions with ``active_leases`` (leases held) annotated."""
    return WorkerSession.objects.filter(state__in=LIVE_SESSION_STATES).annotate(
        active_leases=Count("leases", filter=Q(leases__state=LeaseState.LEASED))
    )


def workers(*, state: str | None = None, label: str | None = None) -> QuerySet[Worker]:
    """Workers, each with ``live`` (a list of at most one live session, annotated as in
    :func:`live_sessions`). ``state``: a worker state; ``label``: ``KEY=VALUE`` that the live
    session's capabilities carry. Raises ``validation_failed`` naming ``state`` or ``label``."""
    queryset = Worker.objects.all()
    if state is not None:
        if state not in WorkerState.values:
            raise DomainError(
                "validation_failed", f"must be one of {', '.join(WorkerState.values)}", field="state"
            )
        queryset = queryset.filter(state=state)
    if label is not None:
        key, value = _label(label)
        # The stored snapshot is canonical JSON text; read it as JSON to match one label exactly.
        labelled = (
            WorkerSession.objects.filter(worker=OuterRef("pk"), state__in=LIVE_SESSION_STATES)
            .annotate(snapshot=Cast("capabilities", JSONField()))
            .filter(**{f"snapshot__labels__{key}": value})
        )
        queryset = queryset.filter(Exists(labelled))
    return queryset.prefetch_related(Prefetch("sessions", queryset=live_sessions(), to_attr="live"))


def worker(worker_id: uuid.UUID) -> Worker:
    """One worker as :func:`workers` gives it. Raises ``worker_not_found``."""
    found = workers().filter(pk=worker_id).first()
    if found is None:
        raise DomainError("worker_not_found", "no such worker")
    return found


@dataclass(frozen=True)
class SessionFacts:
    """What an operator reads about a live session. ``heartbeat_age_seconds`` is derived from
    the lease: a heartbeat sets expiry = now + ``SESSION_LEASE_SECONDS``."""

    session: WorkerSession
    capacity_used: int
    heartbeat_age_seconds: float
    version_policy: str
    capabilities: dict[str, Any] | None


def session_facts(session: WorkerSession, *, now: datetime, with_capabilities: bool = False) -> SessionFacts:
    """Facts of a session from :func:`live_sessions`; ``now`` is the database clock."""
    since = (now - session.lease_expires_at).total_seconds() + protocol().session_lease_seconds
    return SessionFacts(
        session=session,
        capacity_used=getattr(session, "active_leases", 0),
        heartbeat_age_seconds=round(max(0.0, since), 1),
        version_policy=version_verdict(session.software_version, session.protocol_version).status,
        capabilities=json.loads(session.capabilities) if with_capabilities else None,
    )


def active_attempts(worker_id: uuid.UUID) -> list[RunDispatchLease]:
    """The worker's active run leases with their attempts (what it is running or starting)."""
    return list(
        RunDispatchLease.objects.filter(worker_id=worker_id, state=LeaseState.LEASED)
        .select_related("attempt")
        .order_by("claimed_at")
    )
