"""Session expiry sweep: mark lapsed sessions expired and settle their leases (ADR-0012 §3)."""

from __future__ import annotations

import uuid

from actions.sessions.endings import expire_session
from audit.liveness import expiry_cutoff
from audit.models import ActorType
from core.conf import protocol
from core.db import db_now, write_path
from workers.locks import lock_worker_for_session
from workers.models import LIVE_SESSION_STATES, WorkerSession


@write_path
def session_expire(*, session_id: uuid.UUID) -> bool:
    """Mark one lapsed session ``expired`` and settle its run leases; False if it was not lapsed.

    Locks the session's worker first (``lock_worker_for_session``), then re-checks state and
    expiry against the database clock in the ``UPDATE … WHERE`` itself, so it is safe against
    heartbeats, replacements and other sweepers running at once. A lapsed session was already
    invisible to candidates (``placement.selectors.live_workers``) and refused by every fence
    before this runs; this records the fact (``session.expired``) and settles its leases
    (ADR-0012 §3). A lapse during an outage of the control plane counts only once its grace window
    passed (``audit.liveness.expiry_cutoff``; docs/leases.md, Outages). Raises: ``storage_busy``,
    ``lock_timeout``.
    """
    worker = lock_worker_for_session(session_id)
    if worker is None:
        return False
    now = db_now()
    session = WorkerSession.objects.get(pk=session_id)
    return expire_session(session, now=now, actor_type=ActorType.RECONCILER, lapsed_by=expiry_cutoff(now))


def sweep_expired_sessions(*, batch: int | None = None) -> int:
    """Mark up to ``batch`` (default ``SWEEP_BATCH``) lapsed live sessions expired (ADR-0012 §3).

    Oldest expiry first, one :func:`session_expire` transaction each; returns how many it marked.
    Safe on many replicas and sweepers at once (each write re-checks). Raises ``storage_busy``,
    ``lock_timeout`` from a single expiry (the caller's loop carries on next cycle).
    """
    limit = batch or protocol().sweep_batch
    cutoff = expiry_cutoff(db_now())
    lapsed = list(
        WorkerSession.objects.filter(state__in=LIVE_SESSION_STATES, lease_expires_at__lte=cutoff)
        .order_by("lease_expires_at")
        .values_list("pk", flat=True)[:limit]
    )
    return sum(1 for session_id in lapsed if session_expire(session_id=session_id))
