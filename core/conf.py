"""Typed access to the protocol's timings and limits (``settings.QINGLONG``).

Read on every call, so ``override_settings``/the pytest ``settings`` fixture take effect at once:
the snapshot is rebuilt whenever the settings' mapping is another object or holds other values
than the one it was built from (a signed request reads it about seven times).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings

#: The environment variable naming the file whose appearance tells a server process that
#: ``manage.py serve`` is stopping (``api.waiting`` then ends its waiting claims at once).
SERVE_STOP_FILE_VARIABLE = "QINGLONG_SERVE_STOP_FILE"
#: ASGI scope key of a waiting request: the event loop's clock (``loop.time()``) when its head
#: arrived (set by ``qinglong.serving.RequestGuard``). A wait's bound runs from there, not from
#: when its view got to it (``api.leases.waiting``): queueing for the checks counts against it.
RECEIVED_AT_SCOPE_KEY = "qinglong.received_at"
#: The environment variable that gives ``manage.py serve``'s server processes a PostgreSQL
#: connection pool (read by ``qinglong.settings``; serve sets it unless it is already set).
SERVE_DB_POOL_VARIABLE = "QINGLONG_SERVE_DB_POOL"


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
    claim_wait_max_seconds: float
    claim_wait_recheck_seconds: float


def claim_wait_bound(requested: float) -> float:
    """The seconds a waiting claim may wait (docs/leases.md, "Waiting claims"): what the worker
    asked for, at most ``CLAIM_WAIT_MAX_SECONDS``."""
    return max(0.0, min(float(requested), protocol().claim_wait_max_seconds))


#: (the settings mapping, a copy of its items, the snapshot built from them), per settings name.
_SNAPSHOTS: dict[str, tuple[object, dict, Any]] = {}
_Shape = TypeVar("_Shape")


def _snapshot(name: str, shape: type[_Shape]) -> _Shape:
    raw = getattr(settings, name)
    cached = _SNAPSHOTS.get(name)
    if cached is not None and cached[0] is raw and cached[1] == raw:
        return cached[2]
    snapshot = shape(**{key.lower(): value for key, value in raw.items()})
    _SNAPSHOTS[name] = (raw, dict(raw), snapshot)
    return snapshot


def protocol() -> ProtocolSettings:
    """Return the current protocol settings (an immutable snapshot of ``settings.QINGLONG``)."""
    return _snapshot("QINGLONG", ProtocolSettings)


def is_cluster() -> bool:
    """True in the ``cluster-control`` profile (several replicas, PostgreSQL, Redis)."""
    return settings.QINGLONG_PROFILE == "cluster-control"


@dataclass(frozen=True)
class OutputSettings:
    """Job output limits (``settings.QINGLONG_OUTPUT``; docs/logs.md): bytes, seconds."""

    log_max_bytes: int
    log_interval_seconds: float
    log_rate_bytes_per_second: int
    rate_output: str


def output() -> OutputSettings:
    """Return the current job output settings (an immutable snapshot of ``settings.QINGLONG_OUTPUT``)."""
    return _snapshot("QINGLONG_OUTPUT", OutputSettings)
