"""Run write paths: tasks and revisions, enqueue, cancel, retry scheduling (SIBLINGS §1, §2).

One public function per write path, each one transaction (``qinglong.db.write_path``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime

import rfc8785
from django.db import IntegrityError

from audit.models import ActorType
from audit.recorder import record
from placement import spec as placement_spec
from protocol.errors import ProtocolError
from protocol.strictjson import display_key
from qinglong.conf import protocol
from qinglong.db import UniqueRace, db_now, is_unique_violation, write_path
from qinglong.errors import DomainError

from .locks import lock_run
from .models import LostRetry, Run, RunAttempt, Task, TaskRevision
from .states import ATTEMPT_LIVE, RUN_TERMINAL, AttemptState, RunState
from .transitions import bump_run, move_attempt, move_run

log = logging.getLogger(__name__)

EXECUTORS = ("shell", "python", "node")
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV = 32
MAX_ENV_VALUE = 1024
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
RETRYABLE_OUTCOMES = ("failed", "timed_out")


@dataclass(frozen=True)
class RevisionSpec:
    """Everything an immutable task revision fixes.

    ``command`` ≤ 64 KiB of UTF-8; ``timeout_seconds`` 1–604800; ``env`` ≤ 32 NAME→value
    (values ≤ 1024 characters, no NUL); ``placement`` a parsed PlacementSpec document (see
    ``placement.spec``); ``max_attempts`` 1–20; ``retry_on`` ⊆ {failed, timed_out};
    ``lost_retry`` never | idempotent | deduplicated; backoff seconds 1–86400.
    """

    executor: str
    command: str
    timeout_seconds: int
    env: dict[str, str] = field(default_factory=dict)
    placement: dict | None = None
    max_attempts: int = 1
    retry_on: tuple[str, ...] = ()
    lost_retry: str = LostRetry.NEVER
    retry_backoff_seconds: int = 10
    retry_backoff_max_seconds: int = 300


def _validate(spec: RevisionSpec) -> placement_spec.PlacementSpec:
    if spec.executor not in EXECUTORS:
        raise DomainError("validation_failed", f"must be one of {', '.join(EXECUTORS)}", field="executor")
    if not spec.command or len(spec.command.encode("utf-8", "surrogatepass")) > MAX_COMMAND_BYTES:
        raise DomainError("validation_failed", f"must be 1 to {MAX_COMMAND_BYTES} bytes", field="command")
    if "\x00" in spec.command:
        raise DomainError("validation_failed", "must not contain NUL", field="command")
    if not 1 <= spec.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise DomainError("validation_failed", f"must be 1 to {MAX_TIMEOUT_SECONDS}", field="timeoutSeconds")
    if len(spec.env) > MAX_ENV:
        raise DomainError("validation_failed", f"at most {MAX_ENV} variables", field="env")
    for name, value in spec.env.items():
        if not ENV_NAME.match(name):
            raise DomainError("validation_failed", "variable names are [A-Za-z_][A-Za-z0-9_]*",
                              field=f"env.{display_key(name)}")
        if not isinstance(value, str) or len(value) > MAX_ENV_VALUE or "\x00" in value:
            raise DomainError(
                "validation_failed", f"values are strings of at most {MAX_ENV_VALUE} characters",
                field=f"env.{display_key(name)}"
            )
    if not 1 <= spec.max_attempts <= 20:
        raise DomainError("validation_failed", "must be 1 to 20", field="retry.maxAttempts")
    for index, outcome in enumerate(spec.retry_on):
        if outcome not in RETRYABLE_OUTCOMES:
            raise DomainError(
                "validation_failed", "only failed and timed_out outcomes retry", field=f"retry.retryOn[{index}]"
            )
    if len(set(spec.retry_on)) != len(spec.retry_on):
        raise DomainError("validation_failed", "duplicate outcome", field="retry.retryOn")
    if spec.lost_retry not in LostRetry.values:
        raise DomainError("validation_failed", f"must be one of {', '.join(LostRetry.values)}", field="retry.lostRetry")
    if not 1 <= spec.retry_backoff_seconds <= 86400:
        raise DomainError("validation_failed", "must be 1 to 86400", field="retry.backoffSeconds")
    if not spec.retry_backoff_seconds <= spec.retry_backoff_max_seconds <= 86400:
        raise DomainError("validation_failed", "must be between backoffSeconds and 86400", field="retry.backoffMaxSeconds")
    try:
        placement = {} if spec.placement is None else spec.placement
        return placement_spec.normalise(placement, executor=spec.executor)
    except ProtocolError as exc:
        raise DomainError(exc.code, exc.message, field=f"placement.{exc.field}" if exc.field else "placement") from None


def _spec_sha256(spec: RevisionSpec, placement: placement_spec.PlacementSpec) -> str:
    content = {
        "executor": spec.executor,
        "command": spec.command,
        "env": spec.env,
        "timeoutSeconds": spec.timeout_seconds,
        "placementSha256": placement.sha256,
    }
    return hashlib.sha256(rfc8785.dumps(content)).hexdigest()


def _create_revision(task: Task, spec: RevisionSpec, placement: placement_spec.PlacementSpec, number: int,
                     user) -> TaskRevision:
    return TaskRevision.objects.create(
        task=task,
        number=number,
        executor=spec.executor,
        command=spec.command,
        env=dict(spec.env),
        timeout_seconds=spec.timeout_seconds,
        placement=placement.canonical_text,
        placement_sha256=placement.sha256,
        max_attempts=spec.max_attempts,
        retry_on=list(spec.retry_on),
        lost_retry=spec.lost_retry,
        retry_backoff_seconds=spec.retry_backoff_seconds,
        retry_backoff_max_seconds=spec.retry_backoff_max_seconds,
        spec_sha256=_spec_sha256(spec, placement),
        created_by=user if user is not None and getattr(user, "pk", None) else None,
    )


@write_path
def task_create(*, name: str, spec: RevisionSpec, description: str = "", user=None) -> TaskRevision:
    """Create a task and its revision 1. ``name`` is a slug (≤100). Returns the revision.

    Raises ``validation_failed``/``placement_invalid`` naming the field; ``validation_failed`` on
    ``name`` if a task of that name exists.
    """
    if not name or len(name) > 100 or not re.fullmatch(r"[-a-zA-Z0-9_]+", name):
        raise DomainError("validation_failed", "must be a slug of at most 100 characters", field="name")
    placement = _validate(spec)
    if Task.objects.filter(name=name).exists():
        raise DomainError("validation_failed", f"a task named {name!r} exists", field="name")
    try:
        task = Task.objects.create(name=name, description=description[:200])
    except IntegrityError as exc:
        if is_unique_violation(exc):  # created concurrently: the re-run sees it and refuses by name
            raise UniqueRace("task name inserted concurrently") from exc
        raise
    revision = _create_revision(task, spec, placement, 1, user)
    record("task.created", actor_type=ActorType.OPERATOR, actor=_actor(user), data={"revision": 1})
    return revision


@write_path
def revision_create(*, task_id: uuid.UUID, spec: RevisionSpec, user=None) -> TaskRevision:
    """Add a new immutable revision to a task; runs enqueued later pin it. Raises as task_create."""
    placement = _validate(spec)
    task = Task.objects.select_for_update().filter(pk=task_id).first()
    if task is None:
        raise DomainError("task_not_found", "no such task", field="taskId")
    latest = task.revisions.order_by("-number").values_list("number", flat=True).first() or 0
    revision = _create_revision(task, spec, placement, latest + 1, user)
    record("task.revised", actor_type=ActorType.OPERATOR, actor=_actor(user), data={"revision": revision.number})
    return revision


def _actor(user) -> str:
    return getattr(user, "username", "") or ""


def _new_attempt(run: Run, number: int, now: datetime, actor_type: str, actor: str) -> RunAttempt:
    attempt = RunAttempt.objects.create(
        run=run, number=number, state=AttemptState.CLAIMED, priority=run.priority, ready_at=now, created_at=now,
        placement_sha256=run.revision.placement_sha256,
    )
    record(
        "attempt.claimed",
        actor_type=actor_type,
        actor=actor,
        run_id=run.pk,
        attempt_id=attempt.pk,
        data={"number": number},
    )
    return attempt


@write_path
def run_enqueue(
    *, revision_id: uuid.UUID, priority: int = 0, actor_type: str = ActorType.OPERATOR, actor: str = ""
) -> Run:
    """Create a run pinned to ``revision_id`` and queue its first attempt (one transaction).

    ``priority`` −100…100, higher first. Writes the run (created → queued), attempt 1
    (``claimed``: owned by the queue, awaiting a lease) and the events ``run.created``,
    ``run.queued``, ``attempt.claimed``. Raises ``revision_not_found``, ``validation_failed``.
    """
    if not -100 <= priority <= 100:
        raise DomainError("validation_failed", "must be between -100 and 100", field="priority")
    revision = TaskRevision.objects.filter(pk=revision_id).first()
    if revision is None:
        raise DomainError("revision_not_found", "no such task revision", field="revisionId")
    now = db_now()
    run = Run.objects.create(
        task_id=revision.task_id, revision=revision, priority=priority, created_at=now, created_by=actor[:150]
    )
    record("run.created", actor_type=actor_type, actor=actor, run_id=run.pk, run_sequence=0)
    move_run(run, RunState.QUEUED, actor_type=actor_type, actor=actor, attempt_count=1)
    _new_attempt(run, 1, now, actor_type, actor)
    return run


@dataclass(frozen=True)
class CancelResult:
    run: Run
    #: "requested" (intent recorded now), "already_requested" or "already_terminal".
    status: str


@write_path
def run_cancel(*, run_id: uuid.UUID, reason: str = "", actor_type: str = ActorType.OPERATOR,
               actor: str = "") -> CancelResult:
    """Record a durable cancellation request for a run (SIBLINGS §2).

    The first request sets ``cancel_requested_at`` and appends ``run.cancel_requested``. An attempt
    that holds no active lease (queued, retry wait) is cancelled at once with its run. A leased
    attempt learns of it from its next renew/heartbeat/ACK answer; its worker stops the process
    and completes ``cancelled``. If that worker vanishes, lease settlement cancels instead of
    retrying. No new attempt is ever created for a cancel-requested run.

    Locks: the run row. Writes (first request only): ``cancel_requested_at`` = DB now, the
    reason, version + 1, ``run.cancel_requested``; for an unleased attempt also attempt and run
    ``cancelled`` with their events (a lapsed, unswept lease of it is released ``cancelled``).
    Returns the run and ``requested``/``already_requested``/``already_terminal``.
    Raises ``run_not_found``, ``validation_failed`` (reason over 200 characters).
    """
    if len(reason) > 200:
        raise DomainError("validation_failed", "at most 200 characters", field="reason")
    run = lock_run(run_id)
    if run.state in RUN_TERMINAL:
        return CancelResult(run, "already_terminal")
    if run.cancel_requested_at is not None:
        return CancelResult(run, "already_requested")
    now = db_now()
    bump_run(
        run, "run.cancel_requested", actor_type=actor_type, actor=actor, cancel_requested_at=now,
        cancel_reason=reason,
    )
    live = RunAttempt.objects.filter(run=run, state__in=ATTEMPT_LIVE).first()
    unleased = live is not None and live.state == AttemptState.CLAIMED and (
        live.lease_expires_at is None or live.lease_expires_at <= now
    )
    if live is None or unleased:
        from leases.settlement import release_expired_lease_of

        if live is not None:
            release_expired_lease_of(live, now=now, actor_type=actor_type, actor=actor)
            move_attempt(live, AttemptState.CANCELLED, actor_type=actor_type, actor=actor, finished_at=now,
                         outcome_reason="cancelled_by_user")
        move_run(run, RunState.CANCELLED, actor_type=actor_type, actor=actor, finished_at=now,
                 next_attempt_at=None, error_class="cancelled_by_user")
    return CancelResult(run, "requested")


@write_path
def run_requeue(*, run_id: uuid.UUID) -> Run | None:
    """When a ``retry_wait`` run is due: queue it with attempt N+1 (SIBLINGS §1 transaction 2).

    All or nothing: run → queued, ``attempt_count`` + 1, a new ``claimed`` attempt (which shares
    no worker, session, lease or handle with earlier ones), ``run.queued`` + ``attempt.claimed``.
    A run whose cancellation was requested meanwhile is cancelled instead. Locks: the run row;
    due-ness is re-checked against the DB clock after the lock. Returns None (writes nothing)
    if the run is not due or no longer waiting.
    """
    run = lock_run(run_id)
    now = db_now()
    if run.state != RunState.RETRY_WAIT or run.next_attempt_at is None or run.next_attempt_at > now:
        return None
    if run.cancel_requested_at is not None:
        return move_run(run, RunState.CANCELLED, actor_type=ActorType.RECONCILER, finished_at=now,
                        next_attempt_at=None, error_class="cancelled_by_user")
    number = run.attempt_count + 1
    move_run(run, RunState.QUEUED, actor_type=ActorType.RECONCILER, attempt_count=number, next_attempt_at=None)
    _new_attempt(run, number, now, ActorType.RECONCILER, "")
    return run


def sweep_due_retries(*, batch: int | None = None) -> int:
    """Requeue up to ``batch`` (default ``SWEEP_BATCH``) due ``retry_wait`` runs, one transaction
    each, oldest due first (partial index ``run_retry_due``); return how many were queued. Safe
    with several sweepers: each requeue re-checks under the run lock."""
    now = db_now()
    due = list(
        Run.objects.filter(state=RunState.RETRY_WAIT, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[: batch or protocol().sweep_batch]
    )
    queued = 0
    for run_id in due:
        try:
            queued += run_requeue(run_id=run_id) is not None
        except DomainError as exc:
            if exc.code not in ("lock_timeout", "storage_busy"):
                raise
            log.warning("run %s not requeued this cycle: %s", run_id, exc.code)  # the next cycle retries
    return queued

