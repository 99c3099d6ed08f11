"""What an immutable task revision fixes, and its bounds (``docs/leases.md`` Retry policy; ``runs.states``).

Pure: validation against placement lives with the write path (``actions.tasks``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from runs.models import LostRetry

EXECUTORS = ("shell", "python", "node")


MAX_COMMAND_BYTES = 64 * 1024


MAX_ENV = 32


MAX_ENV_VALUE = 1024


MAX_TIMEOUT_SECONDS = 7 * 24 * 3600


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


RETRYABLE_OUTCOMES = ("failed", "timed_out")

#: Declared artifact globs per revision, and the largest limits a revision may declare.
MAX_OUTPUT_PATHS = 16
MAX_OUTPUT_PATH_CHARS = 200
MAX_ARTIFACT_FILES = 256
MAX_ARTIFACT_FILE_BYTES = 1024 * 1024 * 1024
MAX_RETENTION_DAYS = 3650


@dataclass(frozen=True)
class OutputSpec:
    """What a revision keeps of its attempts (docs/logs.md): ``secret_env`` names of ``env``
    variables masked in the stored log; ``paths`` artifact globs relative to the work directory
    (≤ 16, no absolute paths, no ``..``); per-file and total bytes, file count; retention in days."""

    secret_env: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    max_files: int = 16
    max_file_bytes: int = 16 * 1024 * 1024
    max_total_bytes: int = 64 * 1024 * 1024
    retention_days: int = 30

    def declared(self) -> dict | None:
        """The canonical declaration for the revision digest, or None when all defaults."""
        if self == OutputSpec():
            return None
        return {
            "secretEnv": sorted(self.secret_env),
            "paths": list(self.paths),
            "maxFiles": self.max_files,
            "maxFileBytes": self.max_file_bytes,
            "maxTotalBytes": self.max_total_bytes,
            "retentionDays": self.retention_days,
        }


@dataclass(frozen=True)
class RevisionSpec:
    """Everything an immutable task revision fixes.

    ``command`` ≤ 64 KiB of UTF-8; ``timeout_seconds`` 1–604800; ``env`` ≤ 32 NAME→value
    (values ≤ 1024 characters, no NUL); ``placement`` a parsed PlacementSpec document (see
    ``placement.spec``); ``max_attempts`` 1–20; ``retry_on`` ⊆ {failed, timed_out};
    ``lost_retry`` never | idempotent | deduplicated; backoff seconds 1–86400;
    ``lost_after_seconds`` 0–86400 or None (``QINGLONG_LOST_AFTER_SECONDS``): the hard deadline
    past a run lease's expiry (docs/leases.md, Hard deadline); ``output`` the secrets, artifacts
    and retention of :class:`OutputSpec`.
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
    lost_after_seconds: int | None = None
    output: OutputSpec = field(default_factory=OutputSpec)
