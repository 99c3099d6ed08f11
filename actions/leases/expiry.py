"""Expiry sweep: settle run leases that lapsed by the database clock (ADR-0012 §3; ``docs/leases.md`` Expiry).


Bounded batches of single-lease transactions, each a compare-and-swap; safe with any number of
sweepers on any number of replicas.
"""

from __future__ import annotations

import logging
import uuid

from django.db.models import Exists, OuterRef, QuerySet

from audit.liveness import expiry_cutoff
from audit.models import ActorType
from core.conf import protocol
from core.db import db_now, write_path
from core.errors import DomainError
from leases.models import LeaseState, ReleaseReason, RunDispatchLease
from leases.settlement import settle_lease
from runs.locks import lock_run
from runs.models import RunAttempt
from runs.outcomes import conclude_attempt
from runs.states import AttemptState
from workers.locks import lock_worker

log = logging.getLogger(__name__)

#: Refusals of a sweep's single-item transaction that the next cycle may not meet again.
TRANSIENT_CODES = ("lock_timeout", "storage_busy")


@write_path
def lease_expire(*, lease_id: uuid.UUID, observed_version: int) -> bool:
    """Settle one lapsed lease if it is still lapsed at the version the sweep observed (docs/leases.md, States
    ``expireWithLease``, ADR-0012 "not implemented yet": expiry/lost).

    Arguments: ``lease_id`` and ``observed_version``, one pair from :func:`expired_leases`.
    Locks: the lease's worker row, then its run row (the order every lease write uses). Writes,
    only if its own ``UPDATE … WHERE`` still finds the lease ``leased``, of the same lease
    generation, at the observed version and expired by the DB clock read after the locks:
    unstarted attempt → lease released (``dispatch_timeout``), attempt back in the queue under the
    same number (no try consumed); started attempt → lease released (``lease_expired``), attempt
    and run ``lost``, then ``retry_wait`` with an absolute next-attempt time, ``failed`` or
    ``cancelled`` (``runs.outcomes``). A renewal or completion that committed between the sweep's
    read and this write makes the CAS miss and nothing is written; several sweepers on the same
    lease queue on the worker lock and all but one miss. Returns whether it settled the lease.
    Raises only ``lock_timeout``/``storage_busy``.
    """
    lease = RunDispatchLease.objects.filter(pk=lease_id).first()
    if lease is None:
        return False
    lock_worker(lease.worker_id)
    now = db_now()
    return settle_lease(
        lease,
        reason=ReleaseReason.LEASE_EXPIRED,
        now=now,
        actor_type=ActorType.RECONCILER,
        expired_only=True,
        observed_version=observed_version,
        lapsed_by=expiry_cutoff(now),
    )


def expired_leases(*, batch: int | None = None) -> list[tuple[uuid.UUID, int]]:
    """(lease id, version) of up to ``batch`` (default ``SWEEP_BATCH``) lapsed active leases,
    oldest expiry first, by the DB clock; served by the partial index ``lease_active_expiry``.
    A lapse during an outage of the control plane counts only once its grace window passed
    (``audit.liveness.expiry_cutoff``; docs/leases.md, Outages)."""
    cutoff = expiry_cutoff(db_now())
    return list(
        RunDispatchLease.objects.filter(state=LeaseState.LEASED, expires_at__lte=cutoff)
        .order_by("expires_at")
        .values_list("pk", "version")[: batch or protocol().sweep_batch]
    )


def sweep_expired_leases(*, batch: int | None = None) -> int:
    """Settle up to ``batch`` lapsed leases, one transaction each; return how many were settled.

    Called by ``actions.sweeps.run_cycle`` (Celery beat, ``manage.py sweep``, ``manage.py serve``).
    Safe with several sweepers at once: each write is a CAS, so at most one settles a lease. A
    lease whose worker row stays locked past the lock timeout (or SQLite stays busy) is left for
    the next cycle; the others in the batch are still settled.
    """
    settled = 0
    for lease_id, version in expired_leases(batch=batch):
        try:
            settled += lease_expire(lease_id=lease_id, observed_version=version)
        except DomainError as exc:
            if exc.code not in TRANSIENT_CODES:
                raise
            log.warning("lease %s not settled this cycle: %s", lease_id, exc.code)
    return settled


def _stranded() -> QuerySet[RunAttempt]:
    """Started attempts without an active lease of their own lease generation."""
    live_lease = RunDispatchLease.objects.filter(
        attempt_id=OuterRef("pk"), lease_generation=OuterRef("lease_generation"), state=LeaseState.LEASED
    )
    return RunAttempt.objects.filter(state__in=(AttemptState.STARTING, AttemptState.RUNNING)).exclude(
        Exists(live_lease)
    )


@write_path
def attempt_settle_stranded(*, attempt_id: uuid.UUID) -> bool:
    """Settle one started attempt whose run lease is gone or already settled (docs/leases.md,
    Stranded attempts); False if it is not stranded (any more).

    Every lease write settles its attempt in the same transaction, so this finds only what an
    out-of-band change (a deleted lease row, a hand-edited state) left behind. Locks the run row,
    re-checks under it, then ends the attempt ``lost`` (reason ``lease_missing``) and decides the
    run like any lost attempt (``runs.outcomes``: retry not before the attempt's last known lease
    expiry plus the hard deadline). Idempotent: a second call finds nothing. Raises
    ``lock_timeout``/``storage_busy``.
    """
    attempt = RunAttempt.objects.filter(pk=attempt_id).values_list("run_id", flat=True).first()
    if attempt is None:
        return False
    run = lock_run(attempt)
    stranded = _stranded().filter(pk=attempt_id).first()
    if stranded is None:
        return False
    now = db_now()
    conclude_attempt(
        run,
        stranded,
        AttemptState.LOST,
        now=now,
        actor_type=ActorType.RECONCILER,
        reason="lease_missing",
        lease_expires_at=stranded.lease_expires_at or now,
    )
    return True


def sweep_stranded_attempts(*, batch: int | None = None) -> int:
    """Settle up to ``batch`` stranded attempts (started, no active lease of their generation), one
    :func:`attempt_settle_stranded` transaction each; returns how many. Belt and braces after any
    fault: a normal write never leaves one behind."""
    ids = list(_stranded().order_by("pk").values_list("pk", flat=True)[: batch or protocol().sweep_batch])
    return sum(1 for attempt_id in ids if attempt_settle_stranded(attempt_id=attempt_id))
