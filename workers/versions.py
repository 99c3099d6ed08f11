"""The agent version policy (ADR-0012 "upgrade"; ``docs/operators.md`` Upgrades).

An agent reports ``softwareVersion`` as ``qinglong-worker/<semver>`` and its ``protocolVersion``
at registration. The control plane refuses a registration whose agent is below
``MIN_AGENT_VERSION`` or whose protocol version is not in ``SUPPORTED_PROTOCOL_VERSIONS``
(``agent_version_unsupported``), and shows every session's version against the same policy.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import nodesemver

from core.conf import protocol

from .models import LIVE_SESSION_STATES, WorkerSession

AGENT_SOFTWARE = "qinglong-worker"


@dataclass(frozen=True)
class VersionVerdict:
    """``status``: ``current`` (meets the policy), ``outdated`` (below the minimum or an
    unsupported protocol) or ``unknown`` (not a ``qinglong-worker/<semver>`` version while a
    minimum is set); ``minimum``: the configured minimum ("" when none)."""

    status: str
    agent_version: str | None
    minimum: str
    supported_protocols: tuple[int, ...]

    @property
    def refused(self) -> bool:
        return self.status != "current"


def agent_version(software_version: str) -> str | None:
    """The semver of a ``qinglong-worker/<semver>`` software version string, else None."""
    name, _, version = software_version.partition("/")
    if name != AGENT_SOFTWARE or nodesemver.valid(version, loose=False) is None:
        return None
    return version


def version_verdict(software_version: str, protocol_version: int) -> VersionVerdict:
    """Judge an agent's ``software_version`` text and ``protocol_version`` against the policy
    (``MIN_AGENT_VERSION``, ``SUPPORTED_PROTOCOL_VERSIONS``). With no minimum set, any software
    version passes; the protocol version is always checked."""
    settings = protocol()
    minimum = settings.min_agent_version
    supported = tuple(settings.supported_protocol_versions)
    version = agent_version(software_version)
    if protocol_version not in supported:
        status = "outdated"
    elif not minimum:
        status = "current"
    elif version is None:
        status = "unknown"
    else:
        status = "outdated" if nodesemver.lt(version, minimum, loose=False) else "current"
    return VersionVerdict(status, version, minimum, supported)


def outdated_live_workers(*, now: datetime) -> set[uuid.UUID]:
    """Workers whose live session (lease unexpired at ``now``, the database clock) runs an agent
    the policy refuses (:func:`version_verdict`: ``outdated`` or ``unknown``). One query, bounded
    by the number of live sessions; the semver comparison runs here, not in SQL."""
    live = WorkerSession.objects.filter(state__in=LIVE_SESSION_STATES, lease_expires_at__gt=now)
    return {
        worker_id
        for worker_id, software, protocol_version in live.values_list(
            "worker_id", "software_version", "protocol_version"
        )
        if version_verdict(software, protocol_version).refused
    }
