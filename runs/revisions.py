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


@dataclass(frozen=True)
class RevisionSpec:
    """Everything an immutable task revision fixes.

    ``command`` ≤ 64 KiB of UTF-8; ``timeout_seconds`` 1–604800; ``env`` ≤ 32 NAME→value
    (values ≤ 1024 characters, no NUL); ``placement`` a parsed PlacementSpec document (see
    ``placement.spec``); ``max_attempts`` 1–20; ``retry_on`` ⊆ {failed, timed_out};
    ``lost_retry`` never | idempotent | deduplicated; backoff seconds 1–86400;
    ``lost_after_seconds`` 0–86400 or None (``QINGLONG_LOST_AFTER_SECONDS``): the hard deadline
    past a run lease's expiry (docs/leases.md, Hard deadline).
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
