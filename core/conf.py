"""Typed access to the protocol's timings and limits (``settings.QINGLONG``).

Read on every call, so ``override_settings``/the pytest ``settings`` fixture take effect at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class ProtocolSettings:
    """Seconds unless named otherwise. See settings.QINGLONG for the environment variables."""

    session_lease_seconds: int
    heartbeat_interval_seconds: int
    heartbeat_jitter_ratio: float
    run_lease_seconds: int
    dispatch_timeout_seconds: int
    claim_poll_seconds: float
    takeovers_per_minute: int
    signature_window_seconds: int
    signature_future_skew_seconds: int
    enrollment_token_ttl_seconds: int
    rotation_grace_seconds: int
    credential_cache_seconds: int
    sqlite_busy_retries: int
    dispatch_hold_seconds: float
    rate_worker: str
    rate_enroll: str
    rate_auth_failures: str
    sweep_batch: int
    liveness_beat_seconds: float
    outage_after_seconds: float
    outage_grace_seconds: float
    lost_after_seconds: int
    min_agent_version: str
    supported_protocol_versions: tuple[int, ...]


def protocol() -> ProtocolSettings:
    """Return the current protocol settings (a fresh, immutable snapshot)."""
    raw = settings.QINGLONG
    return ProtocolSettings(**{key.lower(): value for key, value in raw.items()})


def is_cluster() -> bool:
    """True in the ``cluster-control`` profile (several replicas, PostgreSQL, Redis)."""
    return settings.QINGLONG_PROFILE == "cluster-control"
