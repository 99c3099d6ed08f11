"""Run dispatch leases: the only authority for a worker to execute one run attempt (ADR-0012 §3).

A lease binds one attempt to one worker session and generation, with a worker-generated offer
id and fencing token (stored only as its SHA-256 digest), a per-attempt ``lease_generation``, a
``version`` bumped by renewals, an expiry taken from the database clock, and the completion
sequence/digest that makes a resent completion an exact replay. At most one lease per attempt is
ever active (a partial unique index).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q

from core.lookups import one_of
from protocol.ids import uuid7


class LeaseState(models.TextChoices):
    LEASED = "leased"
    COMPLETED = "completed"
    RELEASED = "released"


class ReleaseReason(models.TextChoices):
    WORKER_RELEASE = "worker_release"  # the worker handed back an unstarted attempt
    DISPATCH_TIMEOUT = "dispatch_timeout"  # no starting ACK before the lease lapsed
    LEASE_EXPIRED = "lease_expired"  # a started attempt's lease lapsed: the attempt is lost
    SESSION_REPLACED = "session_replaced"
    SESSION_EXPIRED = "session_expired"
    SESSION_OFFLINE = "session_offline"  # operator forced the session offline
    WORKER_REVOKED = "worker_revoked"
    CANCELLED = "cancelled"  # cancellation settled a lease whose worker vanished


class RunDispatchLease(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # No single-column indexes on attempt, worker, session and run: the unique (attempt,
    # generation) and (worker, offer id) indexes lead with the first two, the session's active
    # leases have their partial index, a run's leases are read through its attempts; each index
    # less is one entry less to write per claim and release (docs/performance.md).
    attempt = models.ForeignKey(
        "runs.RunAttempt", on_delete=models.PROTECT, related_name="leases", db_index=False
    )
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="leases", db_index=False)
    worker = models.ForeignKey(
        "workers.Worker", on_delete=models.PROTECT, related_name="leases", db_index=False
    )
    session = models.ForeignKey(
        "workers.WorkerSession", on_delete=models.PROTECT, related_name="leases", db_index=False
    )
    session_generation = models.PositiveBigIntegerField(editable=False)
    lease_generation = models.PositiveIntegerField(editable=False)
    offer_id = models.UUIDField(editable=False)
    #: Unique by a constraint (lease_token_digest_unique), which adds no ``varchar_pattern_ops``
    #: index on PostgreSQL as ``unique=True`` would: the digest is only ever compared whole.
    token_digest = models.CharField(max_length=64, editable=False)
    version = models.PositiveIntegerField(default=0, editable=False)
    state = models.CharField(
        max_length=16, choices=LeaseState.choices, default=LeaseState.LEASED, editable=False
    )
    release_reason = models.CharField(max_length=24, choices=ReleaseReason.choices, blank=True, default="")
    expires_at = models.DateTimeField(editable=False)
    #: SHA-256 of the execution spec sent with the offer; a replayed claim must rebuild the same.
    spec_sha256 = models.CharField(max_length=64, editable=False)
    claimed_at = models.DateTimeField(editable=False)
    starting_at = models.DateTimeField(null=True, blank=True, editable=False)
    running_at = models.DateTimeField(null=True, blank=True, editable=False)
    ended_at = models.DateTimeField(null=True, blank=True, editable=False)
    completion_sequence = models.PositiveIntegerField(null=True, blank=True, editable=False)
    completion_sha256 = models.CharField(max_length=64, blank=True, default="", editable=False)
    completion_outcome = models.CharField(max_length=16, blank=True, default="", editable=False)

    class Meta:
        ordering = ["-claimed_at"]
        constraints = [
            models.CheckConstraint(condition=one_of("state", LeaseState.values), name="lease_state_valid"),
            models.UniqueConstraint(
                fields=["attempt"], condition=Q(state=LeaseState.LEASED), name="one_active_lease_per_attempt"
            ),
            models.UniqueConstraint(fields=["attempt", "lease_generation"], name="lease_generation_unique"),
            models.UniqueConstraint(fields=["worker", "offer_id"], name="lease_offer_unique"),
            models.UniqueConstraint(fields=["token_digest"], name="lease_token_digest_unique"),
            models.CheckConstraint(
                condition=~Q(state=LeaseState.RELEASED) | ~Q(release_reason=""),
                name="released_lease_has_reason",
            ),
            # Both facts, not either: a completed lease records the sequence and the outcome.
            models.CheckConstraint(
                condition=~Q(state=LeaseState.COMPLETED)
                | (Q(completion_sequence__isnull=False) & ~Q(completion_outcome="")),
                name="completed_lease_has_sequence_and_outcome",
            ),
            models.CheckConstraint(
                condition=Q(state=LeaseState.COMPLETED)
                | (Q(completion_sequence__isnull=True) & Q(completion_outcome="") & Q(completion_sha256="")),
                name="only_completed_lease_has_outcome",
            ),
            models.CheckConstraint(
                condition=Q(state=LeaseState.RELEASED) | Q(release_reason=""),
                name="only_released_lease_has_reason",
            ),
            models.CheckConstraint(
                condition=one_of("release_reason", ["", *ReleaseReason.values]),
                name="lease_release_reason_valid",
            ),
            # An active lease has no end; a completed or released one has.
            models.CheckConstraint(
                condition=(Q(state=LeaseState.LEASED) & Q(ended_at__isnull=True))
                | (~Q(state=LeaseState.LEASED) & Q(ended_at__isnull=False)),
                name="lease_end_matches_state",
            ),
            models.CheckConstraint(
                condition=Q(running_at__isnull=True) | Q(starting_at__isnull=False),
                name="lease_running_after_starting",
            ),
            models.CheckConstraint(condition=Q(lease_generation__gte=1), name="lease_generation_positive"),
        ]
        indexes = [
            models.Index(
                fields=["expires_at"], condition=Q(state=LeaseState.LEASED), name="lease_active_expiry"
            ),
            # Active leases only: every read by session wants them (capacity, settlement, the
            # heartbeat's cancel list), and the released row a release writes enters no entry.
            models.Index(
                fields=["session"], condition=Q(state=LeaseState.LEASED), name="lease_active_session"
            ),
        ]

    def __str__(self) -> str:
        return f"lease {self.attempt_id} g{self.lease_generation}"


def _json_reader(field: models.Field) -> Callable[[Any], Any] | None:
    if isinstance(field, models.UUIDField | models.ForeignKey):
        return uuid.UUID
    if isinstance(field, models.DateTimeField):
        return datetime.fromisoformat
    return None


@functools.cache
def _lease_columns() -> list[tuple[str, Callable[[Any], Any] | None]]:
    """(column, how its JSON value becomes the field's) for every lease field, in the model's order."""
    return [(field.attname, _json_reader(field)) for field in RunDispatchLease._meta.concrete_fields]


def lease_loaded(values: dict[str, Any]) -> RunDispatchLease:
    """A lease instance from its fields' values by attname (``values``; every field left out takes
    its default), built as Django builds a row it loaded (``Model.from_db``, every field by
    position): about a third of the CPU of the keyword constructor, for the leases a server
    function wrote (a claim's offers). Raises TypeError for a key that names no field, as the
    constructor does."""
    fields, attnames = _fields()
    if not values.keys() <= attnames:
        raise TypeError(f"RunDispatchLease has no field {sorted(values.keys() - attnames)[0]!r}")
    return RunDispatchLease.from_db(
        None,
        (),
        [values[field.attname] if field.attname in values else field.get_default() for field in fields],
    )


@functools.cache
def _fields() -> tuple[tuple[models.Field, ...], frozenset[str]]:
    fields = tuple(RunDispatchLease._meta.concrete_fields)
    return fields, frozenset(field.attname for field in fields)


def lease_from_json(row: dict[str, Any]) -> RunDispatchLease:
    """A lease instance from ``to_jsonb`` of its row (what the PostgreSQL lease functions return).

    Built as Django builds a row it loaded (``Model.from_db``): every field given, by position."""
    values = []
    for column, read in _lease_columns():  # attname = column for every lease field
        value = row[column]
        values.append(value if value is None or read is None else read(value))
    return RunDispatchLease.from_db(None, (), values)  # every field: the names are not read
