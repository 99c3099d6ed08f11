"""Worker API paths and wire limits, shared by the agent and the server's URL configuration."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload

API_PREFIX = "/api/v1/worker/"

ENROLL = API_PREFIX + "enroll"
ROTATE_KEY = API_PREFIX + "credential/rotate"
SESSION_REGISTER = API_PREFIX + "session/register"
SESSION_HEARTBEAT = API_PREFIX + "session/heartbeat"
SESSION_DRAIN = API_PREFIX + "session/drain"
SESSION_OFFLINE = API_PREFIX + "session/offline"
CLAIM = API_PREFIX + "claim"
#: The waiting claim (docs/leases.md "Waiting claims"): served by an async view, no thread each.
CLAIM_WAIT = API_PREFIX + "claim/wait"
LEASE_STARTING = API_PREFIX + "lease/starting"
LEASE_RUNNING = API_PREFIX + "lease/running"
LEASE_START_FAILED = API_PREFIX + "lease/start-failed"
LEASE_RENEW = API_PREFIX + "lease/renew"
LEASE_RELEASE = API_PREFIX + "lease/release"
LEASE_COMPLETE = API_PREFIX + "lease/complete"
LOG_APPEND = API_PREFIX + "lease/log"
ARTIFACT_UPLOAD = API_PREFIX + "lease/artifact"

#: Output tails sent with a completion (bytes of UTF-8 after replacement of invalid sequences).
OUTPUT_TAIL_BYTES = 8 * 1024
#: Bytes JSON may spend on one byte of text: a control character is written ``\u00XX``.
JSON_ESCAPE_FACTOR = 6

#: Request body limits in bytes, enforced before parsing (413 ``body_too_large``).
#: Registration carries the 16 KiB snapshot plus envelope; completion carries two output tails,
#: each as large as JSON may write it (a job's coloured output is mostly escape sequences), plus
#: the fences and a next claim's offers.
BODY_LIMITS = {
    SESSION_REGISTER: 20 * 1024,
    LEASE_COMPLETE: 2 * OUTPUT_TAIL_BYTES * JSON_ESCAPE_FACTOR + 4 * 1024,
    LOG_APPEND: 64 * 1024,
    ARTIFACT_UPLOAD: 64 * 1024,
}
DEFAULT_BODY_LIMIT = 4 * 1024
#: Largest log chunk (raw bytes before base64; docs/logs.md): with base64 and the fences it fits
#: the LOG_APPEND body limit.
LOG_CHUNK_BYTES = 32 * 1024
#: Largest artifact part (raw bytes before base64): fits the ARTIFACT_UPLOAD body limit.
ARTIFACT_PART_BYTES = 32 * 1024
#: Most segments (runs of one stream's bytes) in one log chunk.
MAX_LOG_SEGMENTS = 64
#: Streams a log chunk may name.
LOG_STREAMS = ("stdout", "stderr")
#: Most offers one claim request may ask for.
MAX_OFFERS_PER_CLAIM = 8
#: Most running attempts one waiting claim may watch for cancellation.
MAX_WATCHED_ATTEMPTS = 64
#: Longest wait a worker asks for; the server answers the bound it chose (``waitSeconds``).
MAX_CLAIM_WAIT_SECONDS = 60.0
#: Exit status of `qinglong-worker run` when its session was fenced (superseded, expired,
#: offline): the supervisor should start a fresh process, which registers a new session.
EXIT_FENCED = 3
#: Exit status when the credential is refused (revoked, re-enrolled): do not restart in a loop.
EXIT_CREDENTIAL_REFUSED = 4
#: Exit status when a drain timed out or the final offline call failed (ADR-0012 §5.6).
EXIT_SHUTDOWN_FAILED = 5
#: Exit status when registration is refused with `agent_version_unsupported`: the control plane's
#: version policy refuses this agent; upgrade it, do not restart it in a loop.
EXIT_AGENT_OUTDATED = 6


@overload
def timestamp(at: datetime) -> str: ...


@overload
def timestamp(at: None) -> None: ...


def timestamp(at: datetime | None) -> str | None:
    """``at`` as the worker API writes every time: RFC 3339 in UTC, ``Z`` for the offset,
    microseconds only when there are some (``2026-12-01T12:00:00.123456Z``); None stays None.

    A naive ``at`` is taken as UTC. The same text DRF's ``DateTimeField`` writes with UTC active,
    which the API's output serializers still describe (``tests/api/test_answers.py``)."""
    if at is None:
        return None
    text = (at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)).isoformat()
    return text[:-6] + "Z"
