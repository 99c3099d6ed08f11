"""The protocol's error codes: the one error type, and the catalogue of every stable code.

No Django here: the agent imports this package. Every refused request answers
``{"code", "message", "field"}`` with the catalogued HTTP status; :data:`CATALOGUE` says, for each
code, that status, what it means, and what a worker does on it (:class:`WorkerAction`). The
control plane raises these codes (``core.errors.DomainError``); the agent derives how it
reacts to an answer from the same table (``agent/calls.py``). ``docs/errors.md`` is generated
from it (``manage.py error_codes``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class WorkerAction(StrEnum):
    """What a worker does when a call is refused with a code (see :data:`ACTION_MEANINGS`)."""

    RETRY = "retry"
    WAIT = "wait"
    ADOPT_VERSION = "adopt_version"
    ABANDON_ATTEMPT = "abandon_attempt"
    RESTART = "restart"
    STOP = "stop"
    UPGRADE = "upgrade"
    FIX_REQUEST = "fix_request"
    NONE = "none"


#: One line per action, for ``docs/errors.md``.
ACTION_MEANINGS: dict[WorkerAction, str] = {
    WorkerAction.RETRY: "transient: back off (never sooner than Retry-After) and send the same call again, "
    "re-signed; the session carries on.",
    WorkerAction.WAIT: "nothing is wrong, but there is no work for the session now: ask again later.",
    WorkerAction.ADOPT_VERSION: "an earlier try may have committed: adopt `details.currentVersion` and send "
    "the call once more.",
    WorkerAction.ABANDON_ATTEMPT: "the run lease is no longer this worker's: kill the attempt's process and "
    "report nothing; the session carries on.",
    WorkerAction.RESTART: "the session is fenced: stop every attempt and exit with status 3 (`EXIT_FENCED`); "
    "a new process registers a new session.",
    WorkerAction.STOP: "the credential is refused: stop every attempt and exit with status 4 "
    "(`EXIT_CREDENTIAL_REFUSED`); re-enroll, do not restart in a loop.",
    WorkerAction.UPGRADE: "the control plane's version policy refuses this agent: stop and exit with "
    "status 6 (`EXIT_AGENT_OUTDATED`); upgrade the agent, do not restart it in a loop.",
    WorkerAction.FIX_REQUEST: "the request is wrong as sent (or asks for what cannot be): do not send it "
    "again unchanged; the session carries on.",
    WorkerAction.NONE: "not an answer to worker calls (operator and run endpoints).",
}


class ErrorSpec(NamedTuple):
    """One catalogued code: its HTTP status, what it means, and what a worker does on it."""

    status: int
    meaning: str
    action: WorkerAction


#: Every stable error code, in the order of ``docs/errors.md``.
CATALOGUE: dict[str, ErrorSpec] = {
    # --- request shape (any endpoint) ---------------------------------------------------------
    "validation_failed": ErrorSpec(
        400,
        "A field is missing, of the wrong type or out of range; `field` names it.",
        WorkerAction.FIX_REQUEST,
    ),
    "json_malformed": ErrorSpec(400, "The body is not valid UTF-8 JSON.", WorkerAction.FIX_REQUEST),
    "json_duplicate_key": ErrorSpec(400, "An object in the body repeats a key.", WorkerAction.FIX_REQUEST),
    "json_too_deep": ErrorSpec(
        400, "The body nests objects/arrays deeper than the endpoint allows.", WorkerAction.FIX_REQUEST
    ),
    "json_number_out_of_range": ErrorSpec(
        400, "NaN, Infinity, or a number beyond the IEEE double range.", WorkerAction.FIX_REQUEST
    ),
    "json_invalid_string": ErrorSpec(
        400, "A string holds a lone surrogate or a control character.", WorkerAction.FIX_REQUEST
    ),
    "content_length_invalid": ErrorSpec(
        400, "The Content-Length header is not a non-negative integer.", WorkerAction.FIX_REQUEST
    ),
    "body_too_large": ErrorSpec(
        413, "The body exceeds the endpoint's size limit (checked before parsing).", WorkerAction.FIX_REQUEST
    ),
    "headers_too_large": ErrorSpec(
        431,
        "The request carries more header fields, or a larger header block, than the server accepts.",
        WorkerAction.FIX_REQUEST,
    ),
    "request_timeout": ErrorSpec(
        408,
        "The request body did not arrive within the server's body timeout; the connection is closed.",
        WorkerAction.RETRY,
    ),
    "unsupported_media_type": ErrorSpec(415, "The body is not application/json.", WorkerAction.FIX_REQUEST),
    "not_acceptable": ErrorSpec(
        406,
        "The Accept header admits no answer this API gives: answers are application/json.",
        WorkerAction.FIX_REQUEST,
    ),
    "method_not_allowed": ErrorSpec(
        405, "The endpoint does not accept this HTTP method.", WorkerAction.FIX_REQUEST
    ),
    "not_found": ErrorSpec(404, "No such resource.", WorkerAction.FIX_REQUEST),
    "host_not_allowed": ErrorSpec(
        400,
        "The Host header names no host this control plane serves (`ALLOWED_HOSTS`).",
        WorkerAction.FIX_REQUEST,
    ),
    "request_rejected": ErrorSpec(
        400,
        "Django refused the request before the API saw it (a suspicious request).",
        WorkerAction.FIX_REQUEST,
    ),
    "internal_error": ErrorSpec(
        500,
        "The control plane failed while answering, on a fault of its own (logged with the request's "
        "`X-Request-ID`); nothing in the request is known to be wrong. The protocol's calls are "
        "replay-safe, so a worker retries it as an unanswered call.",
        WorkerAction.RETRY,
    ),
    "rate_limited": ErrorSpec(
        429, "Too many requests from this principal or address; see Retry-After.", WorkerAction.RETRY
    ),
    "storage_busy": ErrorSpec(
        503, "The database stayed locked through the bounded retry; retry later.", WorkerAction.RETRY
    ),
    "lock_timeout": ErrorSpec(
        503, "A row lock was not granted within the lock timeout; retry later.", WorkerAction.RETRY
    ),
    "database_unavailable": ErrorSpec(
        503,
        "The control plane cannot reach its database (docs/leases.md, Outages); retry after Retry-After.",
        WorkerAction.RETRY,
    ),
    "statement_timeout": ErrorSpec(
        503, "A database statement ran past the statement timeout; retry later.", WorkerAction.RETRY
    ),
    "cache_unavailable": ErrorSpec(
        503,
        "The control plane cannot reach its cache (Redis: replay nonces, rate limits); retry after "
        "Retry-After. Replay protection fails closed (docs/transport.md, Dependency outages).",
        WorkerAction.RETRY,
    ),
    # --- worker transport (ADR-0012 §1) -------------------------------------------------------
    "signature_missing": ErrorSpec(
        401, "The request carries no RFC 9421 Signature/Signature-Input.", WorkerAction.FIX_REQUEST
    ),
    "signature_malformed": ErrorSpec(
        401, "The signature headers do not follow the worker signing profile.", WorkerAction.FIX_REQUEST
    ),
    "signature_invalid": ErrorSpec(
        401, "The signature does not verify with the credential's public key.", WorkerAction.STOP
    ),
    "signature_path_mismatch": ErrorSpec(
        401, "The request was signed for another method or path.", WorkerAction.STOP
    ),
    "signature_stale": ErrorSpec(
        401, "The signature's `created` time is outside the server's clock window.", WorkerAction.RETRY
    ),
    "signature_replayed": ErrorSpec(
        401, "The signature nonce was already used within the window.", WorkerAction.FIX_REQUEST
    ),
    "content_digest_mismatch": ErrorSpec(
        401, "The body does not match its signed Content-Digest.", WorkerAction.FIX_REQUEST
    ),
    "credential_unknown": ErrorSpec(401, "The signature's keyid names no credential.", WorkerAction.STOP),
    "credential_revoked": ErrorSpec(
        401, "The credential was revoked (worker revoked, re-enrolled or rotated).", WorkerAction.STOP
    ),
    "credential_expired": ErrorSpec(
        401, "The credential's rotation grace period is over.", WorkerAction.STOP
    ),
    "credential_superseded": ErrorSpec(
        409, "Only the worker's newest credential may rotate; this key was rotated.", WorkerAction.FIX_REQUEST
    ),
    "worker_not_enrolled": ErrorSpec(
        409,
        "The worker has no active credential to rotate (never enrolled or revoked).",
        WorkerAction.FIX_REQUEST,
    ),
    "principal_mismatch": ErrorSpec(
        403, "A body/path worker id differs from the authenticated worker.", WorkerAction.STOP
    ),
    "worker_credential_forbidden": ErrorSpec(
        403, "Worker credentials cannot reach operator endpoints.", WorkerAction.FIX_REQUEST
    ),
    "not_authenticated": ErrorSpec(
        401,
        "Operator endpoints need an API token (`Authorization: Token …`) or a console session.",
        WorkerAction.NONE,
    ),
    "permission_denied": ErrorSpec(
        403,
        "The user, or the role its API token is scoped to, lacks the permission this act needs "
        "(`message` names it; docs/operators.md).",
        WorkerAction.NONE,
    ),
    "enrollment_token_invalid": ErrorSpec(
        401, "The enrollment token is unknown or belongs to another worker.", WorkerAction.FIX_REQUEST
    ),
    "enrollment_token_used": ErrorSpec(
        401, "The enrollment token was already exchanged (single use).", WorkerAction.FIX_REQUEST
    ),
    "enrollment_token_expired": ErrorSpec(
        401, "The enrollment token's lifetime is over.", WorkerAction.FIX_REQUEST
    ),
    "worker_revoked": ErrorSpec(
        403, "The worker is revoked; it can neither enroll nor act.", WorkerAction.STOP
    ),
    # --- sessions (ADR-0012 §2, §3) -----------------------------------------------------------
    "session_unknown": ErrorSpec(
        404, "No session with this id belongs to the authenticated worker.", WorkerAction.RESTART
    ),
    "session_superseded": ErrorSpec(
        409, "A newer session replaced this one; the process must stop.", WorkerAction.RESTART
    ),
    "session_generation_mismatch": ErrorSpec(
        409, "The generation is not the session's generation.", WorkerAction.RESTART
    ),
    "session_version_conflict": ErrorSpec(
        409, "The expected version is stale; re-read the session version.", WorkerAction.ADOPT_VERSION
    ),
    "session_expired": ErrorSpec(
        409, "The session lease lapsed; the process must stop and start a new session.", WorkerAction.RESTART
    ),
    "session_offline": ErrorSpec(409, "The session went offline; it cannot act again.", WorkerAction.RESTART),
    "session_draining": ErrorSpec(409, "The session is draining and takes no new work.", WorkerAction.WAIT),
    "session_replay_conflict": ErrorSpec(
        409, "This session id was registered with different content.", WorkerAction.FIX_REQUEST
    ),
    "session_has_active_leases": ErrorSpec(
        409, "Offline refused: the session still holds active run leases.", WorkerAction.FIX_REQUEST
    ),
    "no_live_session": ErrorSpec(
        409, "The worker has no online or draining session to take offline.", WorkerAction.FIX_REQUEST
    ),
    "session_takeover_limited": ErrorSpec(
        429, "Too many session replacements for this worker this minute.", WorkerAction.RETRY
    ),
    "session_id_invalid": ErrorSpec(400, "The session id is not a UUIDv7.", WorkerAction.FIX_REQUEST),
    "agent_version_unsupported": ErrorSpec(
        403,
        "The agent's software version is below the minimum, or its protocol version is not supported "
        "(`details` gives the policy): the agent must be upgraded, not restarted.",
        WorkerAction.UPGRADE,
    ),
    "slots_exceed_maximum": ErrorSpec(
        422, "availableSlots is above maxConcurrentRuns.", WorkerAction.FIX_REQUEST
    ),
    # --- capabilities and placement (ADR-0012 §4) ---------------------------------------------
    "capabilities_invalid": ErrorSpec(
        422, "The capability snapshot breaks the schema; `field` names where.", WorkerAction.FIX_REQUEST
    ),
    "capabilities_too_large": ErrorSpec(
        422, "The canonical capability snapshot exceeds 16 KiB.", WorkerAction.FIX_REQUEST
    ),
    "placement_invalid": ErrorSpec(
        422, "The placement spec breaks the schema; `field` names where.", WorkerAction.NONE
    ),
    # --- run leases (ADR-0012 §3) -------------------------------------------------------------
    "lease_unknown": ErrorSpec(
        404,
        "No run lease matches this attempt and lease generation for the worker.",
        WorkerAction.ABANDON_ATTEMPT,
    ),
    "lease_token_mismatch": ErrorSpec(
        409, "The lease token does not match the lease's digest.", WorkerAction.ABANDON_ATTEMPT
    ),
    "lease_offer_conflict": ErrorSpec(
        409, "This offer id was claimed with another lease token or session.", WorkerAction.FIX_REQUEST
    ),
    "lease_generation_mismatch": ErrorSpec(
        409, "A newer lease generation exists for the attempt.", WorkerAction.ABANDON_ATTEMPT
    ),
    "lease_version_conflict": ErrorSpec(
        409, "The expected lease version is stale.", WorkerAction.ADOPT_VERSION
    ),
    "lease_expired": ErrorSpec(
        409, "The run lease lapsed; the attempt's outcome is no longer yours.", WorkerAction.ABANDON_ATTEMPT
    ),
    "lease_released": ErrorSpec(
        409,
        "The run lease was released (timeout, fencing, revocation or release).",
        WorkerAction.ABANDON_ATTEMPT,
    ),
    "lease_completed": ErrorSpec(
        409, "The run lease already completed with another result.", WorkerAction.ABANDON_ATTEMPT
    ),
    "lease_session_mismatch": ErrorSpec(
        409, "The lease belongs to another session or generation.", WorkerAction.RESTART
    ),
    "attempt_not_started": ErrorSpec(
        409, "The running ACK needs a starting ACK first.", WorkerAction.FIX_REQUEST
    ),
    "attempt_already_started": ErrorSpec(
        409, "The attempt already started; it cannot be released.", WorkerAction.FIX_REQUEST
    ),
    "executor_handle_mismatch": ErrorSpec(
        409, "The executor handle differs from the one recorded.", WorkerAction.FIX_REQUEST
    ),
    "capacity_exhausted": ErrorSpec(
        409, "The worker holds as many active leases as it may.", WorkerAction.WAIT
    ),
    "cancel_not_requested": ErrorSpec(
        409,
        "A `cancelled` start failure or completion needs a cancellation request on the run.",
        WorkerAction.FIX_REQUEST,
    ),
    # --- runs (operator API) -------------------------------------------------------------------
    "task_not_found": ErrorSpec(404, "No such task.", WorkerAction.NONE),
    "revision_not_found": ErrorSpec(404, "No such task revision.", WorkerAction.NONE),
    "run_not_found": ErrorSpec(404, "No such run.", WorkerAction.NONE),
    "worker_not_found": ErrorSpec(404, "No such worker.", WorkerAction.NONE),
    "run_not_finished": ErrorSpec(
        409, "Only a finished run can be retried; this one still has a live attempt.", WorkerAction.NONE
    ),
    "invalid_run_transition": ErrorSpec(
        409, "The run cannot move from its state to the requested one.", WorkerAction.NONE
    ),
    "run_version_conflict": ErrorSpec(409, "The run changed under the request.", WorkerAction.NONE),
    # --- logs and artifacts (docs/logs.md) ---------------------------------------------------
    "log_chunk_conflict": ErrorSpec(
        409,
        "A log chunk of this sequence number was stored with other content (or the sequence is "
        "behind what the log already holds); the stored chunk stands.",
        WorkerAction.FIX_REQUEST,
    ),
    "log_backpressure": ErrorSpec(
        429,
        "The attempt's log is arriving faster than the control plane takes it; nothing was stored: "
        "send the same chunk again after Retry-After.",
        WorkerAction.RETRY,
    ),
    "artifact_not_declared": ErrorSpec(
        422,
        "The artifact's name matches none of the revision's declared output globs.",
        WorkerAction.FIX_REQUEST,
    ),
    "artifact_limit_exceeded": ErrorSpec(
        413,
        "The artifact is over a declared limit (`field` names it: maxFiles, maxFileBytes or "
        "maxTotalBytes; `details.limit` its value); nothing was stored.",
        WorkerAction.FIX_REQUEST,
    ),
    "artifact_checksum_mismatch": ErrorSpec(
        422,
        "The uploaded bytes do not have the declared SHA-256; this part was not stored.",
        WorkerAction.FIX_REQUEST,
    ),
    "artifact_conflict": ErrorSpec(
        409,
        "An artifact of this name was (or is being) uploaded with another size or SHA-256, or this part "
        "differs from the stored one.",
        WorkerAction.FIX_REQUEST,
    ),
    "artifact_not_found": ErrorSpec(404, "No such artifact (or it expired).", WorkerAction.NONE),
    "log_not_found": ErrorSpec(404, "No such attempt of this run, or its log expired.", WorkerAction.NONE),
    "artifact_gone": ErrorSpec(
        410,
        "The artifact's row exists but its stored object is missing from the output storage "
        "(deleted outside the control plane); nothing can be downloaded.",
        WorkerAction.NONE,
    ),
    "log_expired": ErrorSpec(
        410,
        "The attempt's log passed its retention (outputs.retentionDays) and was deleted; "
        "details.expiredAt says when.",
        WorkerAction.NONE,
    ),
    "artifact_expired": ErrorSpec(
        410,
        "The artifact passed its retention (outputs.retentionDays) and was deleted; details.expiredAt "
        "says when.",
        WorkerAction.NONE,
    ),
    "log_gone": ErrorSpec(
        410,
        "The attempt's compacted log object is missing from the output storage (deleted outside "
        "the control plane); its bytes cannot be read.",
        WorkerAction.NONE,
    ),
    # --- schedules (docs/schedules.md) --------------------------------------------------------
    "schedule_not_found": ErrorSpec(404, "No such schedule.", WorkerAction.NONE),
    "schedule_version_conflict": ErrorSpec(
        409,
        "The schedule changed since it was read (`expectedVersion` is stale); re-read it.",
        WorkerAction.NONE,
    ),
}


def codes_with(*actions: WorkerAction) -> frozenset[str]:
    """The codes whose worker action is one of ``actions``."""
    return frozenset(code for code, spec in CATALOGUE.items() if spec.action in actions)


class ProtocolError(ValueError):
    """Input that breaks the wire protocol.

    ``code`` is one of the stable codes of :data:`CATALOGUE` (for example ``json_duplicate_key``
    or ``capabilities_invalid``); ``field`` is a dotted path into the document (``labels.region``,
    ``gpus[1].memoryMiB``) or ``None`` for the whole body.
    """

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        self.code = code
        self.message = message
        self.field = field
        super().__init__(f"{code}: {message}" + (f" (field {field})" if field else ""))


def join_path(parent: str | None, key: str | int) -> str:
    """``join_path("gpus", 1) == "gpus[1]"``; ``join_path("labels", "zone") == "labels.zone"``."""
    if isinstance(key, int):
        return f"{parent or ''}[{key}]"
    return f"{parent}.{key}" if parent else key
