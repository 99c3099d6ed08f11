"""Tasks, immutable task revisions, runs and run attempts (docs/leases.md, States).

A *run* pins one immutable :class:`TaskRevision` (command, timeout, placement, retry policy).
Each try of a run is a :class:`RunAttempt` numbered from 1; a retry never reuses an attempt's
worker, session, lease or process handle. The allowed state transitions are data in
``runs.states`` and enforced by ``runs.transitions``; the constraints below back them.

Attempt state ``claimed`` means "this attempt exists and is owned by the run queue": it waits for
(or holds) a run lease but no worker has accepted it yet (docs/leases.md, States).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.conf import protocol
from core.lookups import one_of
from protocol.ids import uuid7

from .states import ATTEMPT_LIVE, ATTEMPT_STARTED, ATTEMPT_TERMINAL, RUN_TERMINAL, AttemptState, RunState


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    name = models.SlugField(max_length=100, unique=True)
    description = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        permissions = [("run_task", "Can run a task now")]

    def __str__(self) -> str:
        return self.name


class LostRetry(models.TextChoices):
    """Whether an attempt lost mid-run may be run again (docs/leases.md, States: no policy = the run
    fails)."""

    NEVER = "never"
    IDEMPOTENT = "idempotent"  # running it twice is harmless
    DEDUPLICATED = "deduplicated"  # the job deduplicates its own side effects


class TaskRevision(models.Model):
    """One immutable execution revision of a task. Never updated; a change is a new revision."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="revisions")
    number = models.PositiveIntegerField(editable=False)
    executor = models.CharField(max_length=32, editable=False, help_text="shell | python | node")
    command = models.TextField(editable=False)
    env = models.JSONField(default=dict, editable=False)
    timeout_seconds = models.PositiveIntegerField(editable=False)
    placement = models.TextField(editable=False, help_text="normalised PlacementSpec, RFC 8785 JSON")
    placement_sha256 = models.CharField(max_length=64, editable=False)
    max_attempts = models.PositiveSmallIntegerField(default=1, editable=False)
    retry_on = models.JSONField(
        default=list, editable=False, help_text="outcomes that retry: failed, timed_out"
    )
    lost_retry = models.CharField(
        max_length=16, choices=LostRetry.choices, default=LostRetry.NEVER, editable=False
    )
    retry_backoff_seconds = models.PositiveIntegerField(default=10, editable=False)
    retry_backoff_max_seconds = models.PositiveIntegerField(default=300, editable=False)
    #: Names of ``env`` variables whose values are secret: masked in the stored log (docs/logs.md).
    secret_env = models.JSONField(default=list, editable=False)
    #: Declared artifacts: globs relative to the job's work directory, and their limits (docs/logs.md).
    output_paths = models.JSONField(default=list, editable=False)
    artifact_max_files = models.PositiveIntegerField(default=16, editable=False)
    artifact_max_file_bytes = models.PositiveBigIntegerField(default=16 * 1024 * 1024, editable=False)
    artifact_max_total_bytes = models.PositiveBigIntegerField(default=64 * 1024 * 1024, editable=False)
    #: Days an attempt's log and artifacts are kept after it ends (the retention sweep deletes them).
    output_retention_days = models.PositiveIntegerField(default=30, editable=False)
    #: The hard deadline past a run lease's expiry (docs/leases.md, Hard deadline); null: the
    #: ``QINGLONG_LOST_AFTER_SECONDS`` setting.
    lost_after_seconds = models.PositiveIntegerField(null=True, blank=True, editable=False)
    #: SHA-256 of the canonical execution content (executor, command, env, timeout, placement).
    spec_sha256 = models.CharField(max_length=64, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["task", "number"], name="revision_number_unique"),
            models.CheckConstraint(condition=Q(timeout_seconds__gte=1), name="revision_timeout_positive"),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1) & Q(max_attempts__lte=20), name="revision_max_attempts_range"
            ),
            models.CheckConstraint(
                condition=one_of("lost_retry", LostRetry.values), name="revision_lost_retry_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} r{self.number}"

    @property
    def effective_lost_after_seconds(self) -> int:
        """Seconds past a lost lease's expiry before its attempt may be retried, and that a worker
        without an answer keeps its job: this revision's, else ``QINGLONG_LOST_AFTER_SECONDS``."""
        if self.lost_after_seconds is not None:
            return self.lost_after_seconds
        return protocol().lost_after_seconds


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="runs")
    revision = models.ForeignKey(TaskRevision, on_delete=models.PROTECT, related_name="runs")
    state = models.CharField(
        max_length=16, choices=RunState.choices, default=RunState.CREATED, editable=False
    )
    version = models.PositiveBigIntegerField(default=0, editable=False)
    event_sequence = models.PositiveBigIntegerField(default=0, editable=False)
    priority = models.SmallIntegerField(default=0)
    attempt_count = models.PositiveSmallIntegerField(default=0, editable=False)
    next_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    cancel_requested_at = models.DateTimeField(null=True, blank=True, editable=False)
    cancel_reason = models.CharField(max_length=200, blank=True, default="", editable=False)
    exit_code = models.IntegerField(null=True, blank=True, editable=False)
    error_class = models.CharField(max_length=32, blank=True, default="", editable=False)
    #: Why the run waits: {mismatch category: number of live workers}, refreshed each dispatch cycle.
    placement_summary = models.JSONField(null=True, blank=True, editable=False)
    placement_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_by = models.CharField(max_length=150, blank=True, default="", editable=False)
    #: The finished run this one retries (an operator's retry, ``actions.runs.run_retry``).
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="retries", editable=False
    )
    created_at = models.DateTimeField(editable=False)
    started_at = models.DateTimeField(null=True, blank=True, editable=False)
    finished_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("cancel_run", "Can cancel a run"), ("retry_run", "Can retry a finished run")]
        constraints = [
            models.CheckConstraint(condition=one_of("state", RunState.values), name="run_state_valid"),
            models.CheckConstraint(
                condition=~one_of("state", RUN_TERMINAL) | Q(finished_at__isnull=False),
                name="run_terminal_has_end",
            ),
            models.CheckConstraint(
                condition=~Q(state=RunState.RETRY_WAIT) | Q(next_attempt_at__isnull=False),
                name="run_retry_wait_has_time",
            ),
            # The state machine's facts, backed by the database (docs/leases.md, States): only a waiting run
            # has a next-attempt time, only an ended run has an end, a running run has a start,
            # and every run past `created` owns at least one attempt.
            models.CheckConstraint(
                condition=Q(state=RunState.RETRY_WAIT) | Q(next_attempt_at__isnull=True),
                name="run_next_attempt_only_when_waiting",
            ),
            models.CheckConstraint(
                condition=one_of("state", RUN_TERMINAL) | Q(finished_at__isnull=True),
                name="run_live_has_no_end",
            ),
            models.CheckConstraint(
                condition=~Q(state=RunState.RUNNING) | Q(started_at__isnull=False),
                name="run_running_has_start",
            ),
            models.CheckConstraint(
                condition=Q(state=RunState.CREATED) | Q(attempt_count__gte=1),
                name="run_has_attempts_once_queued",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100) & Q(priority__lte=100), name="run_priority_range"
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"], condition=Q(state=RunState.RETRY_WAIT), name="run_retry_due"
            ),
            models.Index(fields=["state", "cancel_requested_at"], name="run_state_cancel"),
        ]

    def __str__(self) -> str:
        return str(self.id)


class RunAttempt(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    #: PROTECT here and on ``worker``: deleting a run or a worker never strands or erases an attempt.
    #: No index of its own: ``attempt_number_unique`` (run, number) serves every lookup by run, and
    #: a second index would only be written again on each of an attempt's (non-HOT) state changes.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="attempts", db_index=False)
    number = models.PositiveSmallIntegerField(editable=False)
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.CLAIMED, editable=False
    )
    version = models.PositiveIntegerField(default=0, editable=False)
    # Dispatch order, copied from the run so that one partial index serves the queue.
    priority = models.SmallIntegerField(default=0, editable=False)
    ready_at = models.DateTimeField(editable=False)
    #: The pinned revision's placement digest: the queue is also indexed per placement class, so
    #: a claim reaches work its worker can run however much other work waits ahead of it.
    placement_sha256 = models.CharField(max_length=64, editable=False)
    # Projection of the current run lease (reads and the queue filter only; the lease row decides).
    lease_generation = models.PositiveIntegerField(default=0, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    #: Not indexed: a claim and a release set and clear it, and with no index on it (nor on
    #: the lease expiry and generation beside it) those updates are HOT (docs/performance.md).
    #: A worker's live attempts are found through its active leases (``console/admin/workers.py``).
    worker = models.ForeignKey(
        "workers.Worker",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="attempts",
        db_index=False,
    )
    session_id = models.UUIDField(null=True, blank=True, editable=False)
    # Executor facts reported by the worker (the running ACK) and the outcome.
    pid = models.PositiveIntegerField(null=True, blank=True, editable=False)
    pgid = models.PositiveIntegerField(null=True, blank=True, editable=False)
    executor_handle = models.CharField(max_length=512, blank=True, default="", editable=False)
    exit_code = models.IntegerField(null=True, blank=True, editable=False)
    outcome_reason = models.CharField(max_length=32, blank=True, default="", editable=False)
    stdout_tail = models.TextField(blank=True, default="", editable=False)
    stderr_tail = models.TextField(blank=True, default="", editable=False)
    created_at = models.DateTimeField(editable=False)
    started_at = models.DateTimeField(null=True, blank=True, editable=False)
    finished_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.CheckConstraint(
                condition=one_of("state", AttemptState.values), name="attempt_state_valid"
            ),
            models.UniqueConstraint(fields=["run", "number"], name="attempt_number_unique"),
            models.UniqueConstraint(
                fields=["run"], condition=Q(state__in=ATTEMPT_LIVE), name="one_live_attempt_per_run"
            ),
            models.CheckConstraint(
                condition=~one_of("state", ATTEMPT_TERMINAL) | Q(finished_at__isnull=False),
                name="attempt_terminal_has_end",
            ),
            models.CheckConstraint(condition=Q(number__gte=1), name="attempt_number_positive"),
            models.CheckConstraint(
                condition=one_of("state", ATTEMPT_TERMINAL) | Q(finished_at__isnull=True),
                name="attempt_live_has_no_end",
            ),
            # starting/running exist only under a lease a session claimed (docs/leases.md, Activation ACKs)
            # ...
            models.CheckConstraint(
                condition=~one_of("state", ATTEMPT_STARTED)
                | (Q(session_id__isnull=False) & Q(lease_generation__gte=1)),
                name="attempt_started_under_a_lease",
            ),
            # ... and running exists only once the executor reported its process (running ACK).
            models.CheckConstraint(
                condition=~Q(state=AttemptState.RUNNING)
                | (Q(started_at__isnull=False) & Q(pid__isnull=False)),
                name="attempt_running_has_process",
            ),
        ]
        indexes = [
            # The dispatch queue: keyset over (priority desc, FIFO, id) among attempts awaiting a lease.
            models.Index(
                models.F("priority").desc(),
                "ready_at",
                "id",
                condition=Q(state=AttemptState.CLAIMED),
                name="attempt_dispatch_queue",
            ),
            # The same queue, one range per placement class (runs.selectors.placement_class_heads).
            models.Index(
                "placement_sha256",
                models.F("priority").desc(),
                "ready_at",
                "id",
                condition=Q(state=AttemptState.CLAIMED),
                name="attempt_dispatch_by_placement",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.number}"
