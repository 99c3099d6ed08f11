"""Schedules on tasks and the fires they admitted (``docs/schedules.md``).

A :class:`Schedule` says when a task runs: a cron expression evaluated in an IANA zone, an
optional active window, and the overlap and misfire policies. Admission state lives on the row
(``next_fire_at``/``due_at``, ``version`` for compare-and-swap) and every decision about a fire
leaves one :class:`ScheduleFire` row, unique per (schedule, fire time), that names the run it
started, if any: that is how a run records which schedule and fire time produced it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.lookups import one_of
from protocol.ids import uuid7
from runs.models import Run, Task

MAX_GRACE_SECONDS = 7 * 24 * 3600
MAX_JITTER_SECONDS = 3600


class OverlapPolicy(models.TextChoices):
    """What a fire does while a run of the schedule's task is still live (not ended)."""

    SKIP = "skip", "skip the fire"
    QUEUE_ONE = "queue_one", "queue one, start it when the live run ends"
    ALLOW = "allow", "start another run"


class MisfirePolicy(models.TextChoices):
    """What admission does with fires it finds later than the grace (after downtime)."""

    RUN_ONCE = "run_once", "run once for all missed fires"
    SKIP = "skip", "skip missed fires"


class FireOutcome(models.TextChoices):
    QUEUED = "queued"  # a run was created for this fire
    DEFERRED = "deferred"  # queue_one: waits for the live run to end, then becomes queued
    SKIPPED_OVERLAP = "skipped_overlap"
    SKIPPED_MISFIRE = "skipped_misfire"


class Schedule(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="schedules")
    description = models.CharField(max_length=200, blank=True, default="")
    cron = models.CharField(
        max_length=120, help_text="minute hour day month weekday, or six fields with seconds first"
    )
    timezone = models.CharField(max_length=64, default="UTC", help_text="IANA zone, e.g. Asia/Shanghai")
    enabled = models.BooleanField(default=True)
    start_at = models.DateTimeField(null=True, blank=True, help_text="no fire before this instant")
    end_at = models.DateTimeField(null=True, blank=True, help_text="no fire after this instant")
    overlap = models.CharField(max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.SKIP)
    misfire = models.CharField(max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.RUN_ONCE)
    misfire_grace_seconds = models.PositiveIntegerField(
        default=300, help_text="how late a fire may still start as itself; later ones are misfires"
    )
    jitter_seconds = models.PositiveIntegerField(
        default=0, help_text="a fixed delay of 0…N s per schedule; spreads schedules sharing a time"
    )
    priority = models.SmallIntegerField(default=0)
    # Admission state: written only by actions.schedules, compare-and-swap on `version`.
    next_fire_at = models.DateTimeField(null=True, blank=True, editable=False)
    due_at = models.DateTimeField(null=True, blank=True, editable=False, help_text="next fire + jitter")
    pending_fire_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="queue_one: the fire waiting for the live run"
    )
    last_fire_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_outcome = models.CharField(max_length=16, choices=FireOutcome.choices, blank=True, editable=False)
    last_run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    version = models.PositiveBigIntegerField(default=0, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(editable=False)
    updated_at = models.DateTimeField(editable=False)

    class Meta:
        ordering = ["task", "created_at"]
        constraints = [
            models.CheckConstraint(
                condition=one_of("overlap", OverlapPolicy.values), name="schedule_overlap_valid"
            ),
            models.CheckConstraint(
                condition=one_of("misfire", MisfirePolicy.values), name="schedule_misfire_valid"
            ),
            models.CheckConstraint(
                condition=Q(misfire_grace_seconds__lte=MAX_GRACE_SECONDS), name="schedule_grace_range"
            ),
            models.CheckConstraint(
                condition=Q(jitter_seconds__lte=MAX_JITTER_SECONDS), name="schedule_jitter_range"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100) & Q(priority__lte=100), name="schedule_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(start_at__isnull=True)
                | Q(end_at__isnull=True)
                | Q(end_at__gt=models.F("start_at")),
                name="schedule_window_ordered",
            ),
            # A disabled schedule has no next fire; a next fire always has its due time.
            models.CheckConstraint(
                condition=Q(enabled=True) | Q(next_fire_at__isnull=True), name="schedule_disabled_has_no_fire"
            ),
            models.CheckConstraint(
                condition=Q(next_fire_at__isnull=True, due_at__isnull=True)
                | Q(next_fire_at__isnull=False, due_at__isnull=False),
                name="schedule_fire_has_due",
            ),
        ]
        indexes = [
            # The admission queue: enabled schedules by due time.
            models.Index(fields=["due_at"], condition=Q(due_at__isnull=False), name="schedule_due"),
            models.Index(
                fields=["pending_fire_at"],
                condition=Q(pending_fire_at__isnull=False),
                name="schedule_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} {self.cron} {self.timezone}"


class ScheduleFire(models.Model):
    """One decision about one fire of a schedule: at most one row, and so one run, per fire time."""

    id = models.BigAutoField(primary_key=True)
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="fires")
    fire_at = models.DateTimeField(help_text="the nominal fire time (before jitter)")
    due_at = models.DateTimeField()
    decided_at = models.DateTimeField(help_text="database clock when admission decided")
    outcome = models.CharField(max_length=16, choices=FireOutcome.choices)
    #: Fires this decision stands for: 1, or how many missed fires a misfire decision covered.
    fires = models.PositiveIntegerField(default=1)
    run = models.OneToOneField(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="schedule_fire"
    )

    class Meta:
        ordering = ["schedule", "-fire_at"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "fire_at"], name="schedule_fire_once"),
            models.CheckConstraint(
                condition=one_of("outcome", FireOutcome.values), name="schedule_fire_outcome_valid"
            ),
            models.CheckConstraint(condition=Q(fires__gte=1), name="schedule_fire_count_positive"),
            # Only a queued fire started a run.
            models.CheckConstraint(
                condition=Q(outcome=FireOutcome.QUEUED) | Q(run__isnull=True),
                name="schedule_fire_run_if_queued",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.fire_at:%Y-%m-%dT%H:%M:%SZ}"
