"""The append-only event and audit table (ADR-0012 §4 "explainable", docs/leases.md, States — event
catalogue).

Every state transition of a session, credential, run, attempt or lease writes one row here in the
same transaction. Rows hold identifiers and low-cardinality facts only (reason codes, category
counts, small numbers) — never label sets, commands, tokens or anything secret-like
(``audit.recorder`` enforces the shape). Identifiers are plain UUID columns rather than foreign
keys so that the log outlives what it describes and never blocks a delete.
"""

from django.db import models
from django.db.models.functions import Now

from core.lookups import one_of


class ActorType(models.TextChoices):
    WORKER = "worker"
    OPERATOR = "operator"
    API_APP = "api_app"
    SYSTEM = "system"
    RECONCILER = "reconciler"
    SCHEDULER = "scheduler"  # a schedule admitting a fire (docs/schedules.md)


#: The kinds each claim → release loop writes that nothing reads by kind: left out of the kind index
#: (docs/performance.md, "Claim and release"). A filter on one of them reads the primary key
#: backwards, which meets the newest quickly: they are the commonest kinds.
KIND_INDEX_EXCLUDES = ("lease.released", "run.dispatching")


class Event(models.Model):
    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    kind = models.CharField(max_length=48)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor = models.CharField(max_length=150, blank=True, default="")
    worker_id = models.UUIDField(null=True, blank=True)
    session_id = models.UUIDField(null=True, blank=True)
    run_id = models.UUIDField(null=True, blank=True)
    attempt_id = models.UUIDField(null=True, blank=True)
    lease_id = models.UUIDField(null=True, blank=True)
    run_sequence = models.PositiveBigIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # Partial: every read of it names a worker, and run events (no worker) skip an entry.
            models.Index(
                fields=["worker_id", "kind", "created_at"],
                condition=models.Q(worker_id__isnull=False),
                name="event_worker_kind_time",
            ),
            models.Index(fields=["run_id", "id"], name="event_run"),
            models.Index(
                fields=["kind", "created_at"],
                condition=~models.Q(kind__in=KIND_INDEX_EXCLUDES),
                name="event_kind_time",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=one_of("actor_type", ActorType.values), name="event_actor_type_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.id}"


class SweepMark(models.Model):
    """When a sweep cycle last finished, one row per ``name`` (``cycle``); read by ``/readyz``.

    Written by ``actions.sweeps.run_cycle`` after each cycle (one upsert, outside any other
    transaction); any replica's or Celery beat's cycle counts.
    """

    name = models.CharField(max_length=32, primary_key=True)
    finished_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} at {self.finished_at:%Y-%m-%d %H:%M:%S}"


class ControlPlaneBeat(models.Model):
    """The control plane's own liveness, one shared row (``name`` = ``serving``), beaten on the
    database clock by every serving process (``actions.liveness``) while it can serve — its
    database answers and, in the cluster profile, its cache does too.

    ``beat_at`` is the latest beat of any replica; ``serving_since`` when the current unbroken
    run of beats began; ``outage_began_at`` the last beat before the latest gap longer than
    ``QINGLONG_OUTAGE_AFTER_SECONDS`` (null if there never was one). Read by the expiry sweeps and
    the fences (``audit.liveness``; docs/leases.md, Outages).
    """

    name = models.CharField(max_length=32, primary_key=True)
    beat_at = models.DateTimeField()
    serving_since = models.DateTimeField()
    outage_began_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} beat at {self.beat_at:%Y-%m-%d %H:%M:%S}"
