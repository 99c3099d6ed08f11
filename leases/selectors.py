"""Reads about run leases (no locks; write paths re-read under their locks)."""

from __future__ import annotations

import uuid

from .models import LeaseState, RunDispatchLease


def active_lease_count(session_id: uuid.UUID) -> int:
    """Active (``leased``) run leases held by a session: what capacity checks count."""
    return RunDispatchLease.objects.filter(session_id=session_id, state=LeaseState.LEASED).count()


def cancel_requested_attempt_ids(session_id: uuid.UUID) -> list[uuid.UUID]:
    """Attempts this session holds active leases on whose run has a cancellation request."""
    return list(
        RunDispatchLease.objects.filter(
            session_id=session_id, state=LeaseState.LEASED, run__cancel_requested_at__isnull=False
        )
        .order_by("attempt_id")
        .values_list("attempt_id", flat=True)
    )
