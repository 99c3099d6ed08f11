"""The execution spec a claim hands to a worker, and its digest (ADR-0012 §3, docs/placement.md §5).

The spec is built from the run's pinned, immutable revision, so the same lease always rebuilds
the same spec: a replayed claim compares the digest stored on the lease with a fresh build.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import rfc8785

from runs.models import Run, RunAttempt

from .models import RunDispatchLease


def execution_spec(run: Run, attempt: RunAttempt) -> dict[str, Any]:
    """The ``qinglong/execution-spec@v1`` document for one attempt (no secrets, no lease token)."""
    revision = run.revision
    spec: dict[str, Any] = {
        "kind": "qinglong/execution-spec@v1",
        "runId": str(run.pk),
        "attemptId": str(attempt.pk),
        "attemptNumber": attempt.number,
        "taskId": str(run.task_id),
        "revisionId": str(revision.pk),
        "revisionNumber": revision.number,
        "executor": revision.executor,
        "command": revision.command,
        "env": revision.env,
        "timeoutSeconds": revision.timeout_seconds,
        "lostAfterSeconds": revision.effective_lost_after_seconds,
        "revisionSha256": revision.spec_sha256,
    }
    if revision.secret_env:  # docs/logs.md, Secrets: the agent masks them before it sends
        spec["secretEnv"] = sorted(revision.secret_env)
    if revision.output_paths:  # docs/logs.md, Artifacts: collected after the job, under this lease
        spec["outputs"] = {
            "paths": list(revision.output_paths),
            "maxFiles": revision.artifact_max_files,
            "maxFileBytes": revision.artifact_max_file_bytes,
            "maxTotalBytes": revision.artifact_max_total_bytes,
        }
    return spec


def spec_sha256(spec: dict[str, Any]) -> str:
    """SHA-256 of the RFC 8785 form of an execution spec."""
    return hashlib.sha256(rfc8785.dumps(spec)).hexdigest()


@dataclass(frozen=True)
class Offer:
    """One claimed (or replayed) offer: the durable lease and the spec to execute."""

    lease: RunDispatchLease
    execution: dict[str, Any]
    #: "claimed" for a new lease, "idempotent" for a replay of a committed one.
    status: str
    renew_interval_seconds: int
