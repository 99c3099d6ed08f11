"""Pure session rules shared by the session write paths (ADR-0012 §2, §3; ``docs/sessions.md``).

What a session call answers, the digest a registration fixes for the session's life, the
session lease TTL and the slot bounds. No queries, no writes.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import rfc8785

from core.conf import protocol
from core.errors import DomainError
from workers.models import WorkerSession

MAX_CONCURRENT_RUNS = 256


@dataclass(frozen=True)
class SessionView:
    """What a session call answers: the fence the worker must present next, and its timers."""

    session: WorkerSession
    server_time: datetime
    replaced_session: bool = False
    replayed: bool = False
    cancel_requested: tuple[uuid.UUID, ...] = ()
    #: The operator forced a key rotation; the agent rotates within the grace period.
    rotation_required: bool = False

    @property
    def heartbeat_interval_seconds(self) -> int:
        return protocol().heartbeat_interval_seconds

    @property
    def next_heartbeat_at(self) -> datetime:
        """Server time plus the heartbeat interval, jittered by ±HEARTBEAT_JITTER_RATIO."""
        settings = protocol()
        jitter = random.uniform(-settings.heartbeat_jitter_ratio, settings.heartbeat_jitter_ratio)
        return self.server_time + timedelta(seconds=settings.heartbeat_interval_seconds * (1 + jitter))


def registration_sha256(
    *, capabilities_sha256: str, max_concurrent_runs: int, software_version: str, protocol_version: int
) -> str:
    """SHA-256 (hex) of what a registration fixes for the session's life (ADR-0012 §2).

    Arguments: the canonical capability snapshot's SHA-256 (hex), ``max_concurrent_runs`` (1–256),
    ``software_version`` (≤64 printable ASCII), ``protocol_version`` (≥1), digested as RFC 8785
    JSON. Available slots are dynamic and not part of it, so a replay may report other slots.
    Pure; raises nothing.
    """
    content: dict[str, str | int] = {
        "capabilitiesSha256": capabilities_sha256,
        "maxConcurrentRuns": max_concurrent_runs,
        "softwareVersion": software_version,
        "protocolVersion": protocol_version,
    }
    return hashlib.sha256(rfc8785.dumps(content)).hexdigest()


def check_slots(available_slots: int, max_concurrent_runs: int) -> None:
    """Refuse ``maxConcurrentRuns`` outside 1–256 (``validation_failed``) or ``availableSlots``
    outside 0–max (``slots_exceed_maximum``)."""
    if not 1 <= max_concurrent_runs <= MAX_CONCURRENT_RUNS:
        raise DomainError(
            "validation_failed", f"must be between 1 and {MAX_CONCURRENT_RUNS}", field="maxConcurrentRuns"
        )
    if not 0 <= available_slots <= max_concurrent_runs:
        raise DomainError(
            "slots_exceed_maximum",
            f"availableSlots {available_slots} is not within 0..maxConcurrentRuns {max_concurrent_runs}",
            field="availableSlots",
        )


def session_lease_ttl() -> timedelta:
    """The session lease TTL (``SESSION_LEASE_SECONDS``)."""
    return timedelta(seconds=protocol().session_lease_seconds)
