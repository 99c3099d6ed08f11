"""Tasks and their immutable revisions (``docs/placement.md`` PlacementSpec, ``docs/leases.md`` Retry policy).

A revision is validated once, when it is written: command, environment, timeout, retry policy
and placement (normalised and digested by ``placement.spec``).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

import rfc8785
from django.db import IntegrityError

from audit.models import ActorType
from audit.recorder import record
from core.db import UniqueRace, is_unique_violation, write_path
from core.errors import DomainError
from placement import spec as placement_spec
from protocol.errors import ProtocolError
from protocol.globs import has_control_characters
from protocol.masking import MIN_SECRET_CHARS
from protocol.strictjson import display_key
from runs.locks import lock_task
from runs.models import LostRetry, Task, TaskRevision
from runs.revisions import (
    ENV_NAME,
    EXECUTORS,
    MAX_ARTIFACT_FILE_BYTES,
    MAX_ARTIFACT_FILES,
    MAX_COMMAND_BYTES,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_OUTPUT_PATH_CHARS,
    MAX_OUTPUT_PATHS,
    MAX_RETENTION_DAYS,
    MAX_TIMEOUT_SECONDS,
    RETRYABLE_OUTCOMES,
    RevisionSpec,
)


def _validate_output(spec: RevisionSpec) -> None:
    """The output declaration's rules (docs/logs.md, Artifacts and secrets); names the field."""
    output = spec.output
    for index, name in enumerate(output.secret_env):
        field = f"outputs.secretEnv[{index}]"
        if name not in spec.env:
            raise DomainError("validation_failed", "names no variable of env", field=field)
        if name in output.secret_env[:index]:
            raise DomainError("validation_failed", f"{name!r} is named twice", field=field)
        if len(spec.env[name]) < MIN_SECRET_CHARS:
            # Shorter values are never masked (protocol/masking.py): refuse rather than show it.
            raise DomainError(
                "validation_failed",
                f"the value of {name!r} is shorter than {MIN_SECRET_CHARS} characters: it could not be"
                " masked",
                field=field,
            )
    if len(output.paths) > MAX_OUTPUT_PATHS:
        raise DomainError("validation_failed", f"at most {MAX_OUTPUT_PATHS} globs", field="outputs.paths")
    for index, glob in enumerate(output.paths):
        parts = glob.replace("\\", "/").split("/")
        if (
            not glob
            or len(glob) > MAX_OUTPUT_PATH_CHARS
            or glob.startswith("/")
            or ".." in parts
            or has_control_characters(glob)
        ):
            raise DomainError(
                "validation_failed",
                f"a relative glob of at most {MAX_OUTPUT_PATH_CHARS} characters, without '..'",
                field=f"outputs.paths[{index}]",
            )
    if not 1 <= output.max_files <= MAX_ARTIFACT_FILES:
        raise DomainError("validation_failed", f"must be 1 to {MAX_ARTIFACT_FILES}", field="outputs.maxFiles")
    if not 1 <= output.max_file_bytes <= MAX_ARTIFACT_FILE_BYTES:
        raise DomainError(
            "validation_failed", f"must be 1 to {MAX_ARTIFACT_FILE_BYTES}", field="outputs.maxFileBytes"
        )
    if not output.max_file_bytes <= output.max_total_bytes <= MAX_ARTIFACT_FILES * MAX_ARTIFACT_FILE_BYTES:
        raise DomainError("validation_failed", "must be at least maxFileBytes", field="outputs.maxTotalBytes")
    if not 1 <= output.retention_days <= MAX_RETENTION_DAYS:
        raise DomainError(
            "validation_failed", f"must be 1 to {MAX_RETENTION_DAYS}", field="outputs.retentionDays"
        )


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
            raise DomainError(
                "validation_failed",
                "variable names are [A-Za-z_][A-Za-z0-9_]*",
                field=f"env.{display_key(name)}",
            )
        if not isinstance(value, str) or len(value) > MAX_ENV_VALUE or "\x00" in value:
            raise DomainError(
                "validation_failed",
                f"values are strings of at most {MAX_ENV_VALUE} characters",
                field=f"env.{display_key(name)}",
            )
    _validate_output(spec)
    if not 1 <= spec.max_attempts <= 20:
        raise DomainError("validation_failed", "must be 1 to 20", field="retry.maxAttempts")
    for index, outcome in enumerate(spec.retry_on):
        if outcome not in RETRYABLE_OUTCOMES:
            raise DomainError(
                "validation_failed",
                "only failed and timed_out outcomes retry",
                field=f"retry.retryOn[{index}]",
            )
    if len(set(spec.retry_on)) != len(spec.retry_on):
        raise DomainError("validation_failed", "duplicate outcome", field="retry.retryOn")
    if spec.lost_retry not in LostRetry.values:
        raise DomainError(
            "validation_failed", f"must be one of {', '.join(LostRetry.values)}", field="retry.lostRetry"
        )
    if not 1 <= spec.retry_backoff_seconds <= 86400:
        raise DomainError("validation_failed", "must be 1 to 86400", field="retry.backoffSeconds")
    if not spec.retry_backoff_seconds <= spec.retry_backoff_max_seconds <= 86400:
        raise DomainError(
            "validation_failed", "must be between backoffSeconds and 86400", field="retry.backoffMaxSeconds"
        )
    if spec.lost_after_seconds is not None and not 0 <= spec.lost_after_seconds <= 86400:
        raise DomainError("validation_failed", "must be 0 to 86400", field="retry.lostAfterSeconds")
    try:
        placement = {} if spec.placement is None else spec.placement
        return placement_spec.normalise(placement, executor=spec.executor)
    except ProtocolError as exc:
        raise DomainError(
            exc.code, exc.message, field=f"placement.{exc.field}" if exc.field else "placement"
        ) from None


def revision_check(spec: RevisionSpec) -> None:
    """Validate ``spec`` exactly as :func:`task_create` and :func:`revision_create` will, without
    writing (for forms that show every field error before anything is stored). Raises
    ``validation_failed``/``placement_invalid`` naming the field (``command``, ``env.NAME``,
    ``retry.maxAttempts``, ``placement.required.arch``…)."""
    _validate(spec)


def _spec_sha256(spec: RevisionSpec, placement: placement_spec.PlacementSpec) -> str:
    content: dict[str, Any] = {
        "executor": spec.executor,
        "command": spec.command,
        "env": spec.env,
        "timeoutSeconds": spec.timeout_seconds,
        "placementSha256": placement.sha256,
    }
    declared = spec.output.declared()
    if declared is not None:  # revisions without a declaration keep the digest they always had
        content["outputs"] = declared
    return hashlib.sha256(rfc8785.dumps(content)).hexdigest()


def _create_revision(
    task: Task, spec: RevisionSpec, placement: placement_spec.PlacementSpec, number: int, user
) -> TaskRevision:
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
        secret_env=sorted(spec.output.secret_env),
        output_paths=list(spec.output.paths),
        artifact_max_files=spec.output.max_files,
        artifact_max_file_bytes=spec.output.max_file_bytes,
        artifact_max_total_bytes=spec.output.max_total_bytes,
        output_retention_days=spec.output.retention_days,
        lost_after_seconds=spec.lost_after_seconds,
        spec_sha256=_spec_sha256(spec, placement),
        created_by=user if user is not None and getattr(user, "pk", None) else None,
    )


@write_path
def task_create(
    *, name: str, spec: RevisionSpec, description: str = "", user=None, role: str = ""
) -> TaskRevision:
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
    record(
        "task.created", actor_type=ActorType.OPERATOR, actor=_actor(user), data={"revision": 1, "role": role}
    )
    return revision


@write_path
def revision_create(*, task_id: uuid.UUID, spec: RevisionSpec, user=None, role: str = "") -> TaskRevision:
    """Add a new immutable revision to a task; runs enqueued later pin it. Raises as task_create."""
    placement = _validate(spec)
    task = lock_task(task_id)
    if task is None:
        raise DomainError("task_not_found", "no such task", field="taskId")
    latest = task.revisions.order_by("-number").values_list("number", flat=True).first() or 0
    revision = _create_revision(task, spec, placement, latest + 1, user)
    record(
        "task.revised",
        actor_type=ActorType.OPERATOR,
        actor=_actor(user),
        data={"revision": revision.number, "role": role},
    )
    return revision


def _actor(user) -> str:
    return getattr(user, "username", "") or ""
