"""Domain errors with stable machine codes.

Services raise :class:`DomainError` with a code from :data:`CATALOGUE`; one DRF exception
handler (``api.exceptions``) turns it into ``{"code", "message", "field"}`` with the
catalogued HTTP status. Services never build HTTP responses. ``docs/errors.md`` is generated from
this table (``manage.py error_codes``) and a test keeps the two equal.
"""

from __future__ import annotations

from typing import NamedTuple


class ErrorSpec(NamedTuple):
    status: int
    meaning: str


CATALOGUE: dict[str, ErrorSpec] = {
    # --- request shape (any endpoint) ---------------------------------------------------------
    "validation_failed": ErrorSpec(
        400, "A field is missing, of the wrong type or out of range; `field` names it."
    ),
    "json_malformed": ErrorSpec(400, "The body is not valid UTF-8 JSON."),
    "json_duplicate_key": ErrorSpec(400, "An object in the body repeats a key."),
    "json_too_deep": ErrorSpec(400, "The body nests objects/arrays deeper than the endpoint allows."),
    "json_number_out_of_range": ErrorSpec(400, "NaN, Infinity, or a number beyond the IEEE double range."),
    "json_invalid_string": ErrorSpec(400, "A string holds a lone surrogate or a control character."),
    "content_length_invalid": ErrorSpec(400, "The Content-Length header is not a non-negative integer."),
    "body_too_large": ErrorSpec(413, "The body exceeds the endpoint's size limit (checked before parsing)."),
    "headers_too_large": ErrorSpec(
        431, "The request carries more header fields, or a larger header block, than the server accepts."
    ),
    "request_timeout": ErrorSpec(
        408, "The request body did not arrive within the server's body timeout; the connection is closed."
    ),
    "unsupported_media_type": ErrorSpec(415, "The body is not application/json."),
    "method_not_allowed": ErrorSpec(405, "The endpoint does not accept this HTTP method."),
    "not_found": ErrorSpec(404, "No such resource."),
    "host_not_allowed": ErrorSpec(
        400, "The Host header names no host this control plane serves (`ALLOWED_HOSTS`)."
    ),
    "request_rejected": ErrorSpec(
        400, "Django refused the request before the API saw it (a suspicious request)."
    ),
    "rate_limited": ErrorSpec(429, "Too many requests from this principal or address; see Retry-After."),
    "storage_busy": ErrorSpec(503, "The database stayed locked through the bounded retry; retry later."),
    "lock_timeout": ErrorSpec(503, "A row lock was not granted within the lock timeout; retry later."),
    # --- worker transport (ADR-0012 §1) -------------------------------------------------------
    "signature_missing": ErrorSpec(401, "The request carries no RFC 9421 Signature/Signature-Input."),
    "signature_malformed": ErrorSpec(401, "The signature headers do not follow the worker signing profile."),
    "signature_invalid": ErrorSpec(401, "The signature does not verify with the credential's public key."),
    "signature_path_mismatch": ErrorSpec(401, "The request was signed for another method or path."),
    "signature_stale": ErrorSpec(401, "The signature's `created` time is outside the server's clock window."),
    "signature_replayed": ErrorSpec(401, "The signature nonce was already used within the window."),
    "content_digest_mismatch": ErrorSpec(401, "The body does not match its signed Content-Digest."),
    "credential_unknown": ErrorSpec(401, "The signature's keyid names no credential."),
    "credential_revoked": ErrorSpec(
        401, "The credential was revoked (worker revoked, re-enrolled or rotated)."
    ),
    "credential_expired": ErrorSpec(401, "The credential's rotation grace period is over."),
    "credential_superseded": ErrorSpec(
        409, "Only the worker's newest credential may rotate; this key was rotated."
    ),
    "worker_not_enrolled": ErrorSpec(
        409, "The worker has no active credential to rotate (never enrolled or revoked)."
    ),
    "principal_mismatch": ErrorSpec(403, "A body/path worker id differs from the authenticated worker."),
    "worker_credential_forbidden": ErrorSpec(403, "Worker credentials cannot reach operator endpoints."),
    "not_authenticated": ErrorSpec(401, "Operator endpoints need staff session or token authentication."),
    "permission_denied": ErrorSpec(403, "The authenticated user is not staff."),
    "enrollment_token_invalid": ErrorSpec(
        401, "The enrollment token is unknown or belongs to another worker."
    ),
    "enrollment_token_used": ErrorSpec(401, "The enrollment token was already exchanged (single use)."),
    "enrollment_token_expired": ErrorSpec(401, "The enrollment token's lifetime is over."),
    "worker_revoked": ErrorSpec(403, "The worker is revoked; it can neither enroll nor act."),
    # --- sessions (ADR-0012 §2, §3) -----------------------------------------------------------
    "session_unknown": ErrorSpec(404, "No session with this id belongs to the authenticated worker."),
    "session_superseded": ErrorSpec(409, "A newer session replaced this one; the process must stop."),
    "session_generation_mismatch": ErrorSpec(409, "The generation is not the session's generation."),
    "session_version_conflict": ErrorSpec(409, "The expected version is stale; re-read the session version."),
    "session_expired": ErrorSpec(
        409, "The session lease lapsed; the process must stop and start a new session."
    ),
    "session_offline": ErrorSpec(409, "The session went offline; it cannot act again."),
    "session_draining": ErrorSpec(409, "The session is draining and takes no new work."),
    "session_replay_conflict": ErrorSpec(409, "This session id was registered with different content."),
    "session_has_active_leases": ErrorSpec(
        409, "Offline refused: the session still holds active run leases."
    ),
    "no_live_session": ErrorSpec(409, "The worker has no online or draining session to take offline."),
    "session_takeover_limited": ErrorSpec(429, "Too many session replacements for this worker this minute."),
    "session_id_invalid": ErrorSpec(400, "The session id is not a UUIDv7."),
    "slots_exceed_maximum": ErrorSpec(422, "availableSlots is above maxConcurrentRuns."),
    # --- capabilities and placement (ADR-0012 §4) ---------------------------------------------
    "capabilities_invalid": ErrorSpec(422, "The capability snapshot breaks the schema; `field` names where."),
    "capabilities_too_large": ErrorSpec(422, "The canonical capability snapshot exceeds 16 KiB."),
    "placement_invalid": ErrorSpec(422, "The placement spec breaks the schema; `field` names where."),
    # --- run leases (ADR-0012 §3) -------------------------------------------------------------
    "lease_unknown": ErrorSpec(404, "No run lease matches this attempt and lease generation for the worker."),
    "lease_token_mismatch": ErrorSpec(409, "The lease token does not match the lease's digest."),
    "lease_offer_conflict": ErrorSpec(409, "This offer id was claimed with another lease token or session."),
    "lease_generation_mismatch": ErrorSpec(409, "A newer lease generation exists for the attempt."),
    "lease_version_conflict": ErrorSpec(409, "The expected lease version is stale."),
    "lease_expired": ErrorSpec(409, "The run lease lapsed; the attempt's outcome is no longer yours."),
    "lease_released": ErrorSpec(409, "The run lease was released (timeout, fencing, revocation or release)."),
    "lease_completed": ErrorSpec(409, "The run lease already completed with another result."),
    "lease_session_mismatch": ErrorSpec(409, "The lease belongs to another session or generation."),
    "attempt_not_started": ErrorSpec(409, "The running ACK needs a starting ACK first."),
    "attempt_already_started": ErrorSpec(409, "The attempt already started; it cannot be released."),
    "executor_handle_mismatch": ErrorSpec(409, "The executor handle differs from the one recorded."),
    "capacity_exhausted": ErrorSpec(409, "The worker holds as many active leases as it may."),
    "cancel_not_requested": ErrorSpec(
        409, "A `cancelled` start failure or completion needs a cancellation request on the run."
    ),
    # --- runs (SIBLINGS §1, §2) ---------------------------------------------------------------
    "task_not_found": ErrorSpec(404, "No such task."),
    "revision_not_found": ErrorSpec(404, "No such task revision."),
    "run_not_found": ErrorSpec(404, "No such run."),
    "worker_not_found": ErrorSpec(404, "No such worker."),
    "invalid_run_transition": ErrorSpec(409, "The run cannot move from its state to the requested one."),
    "run_version_conflict": ErrorSpec(409, "The run changed under the request."),
}


class DomainError(Exception):
    """A refused request: ``code`` is a key of :data:`CATALOGUE`, ``field`` names the culprit.

    ``retry_after`` (seconds) is sent as the ``Retry-After`` header for 429/503 codes;
    ``details`` is a small dict of facts the caller needs to recover (for example the current
    session version after ``session_version_conflict``). Raises ``KeyError`` at construction for
    an uncatalogued code (a programming error).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        field: str | None = None,
        retry_after: int | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        self.spec = CATALOGUE[code]
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.details = details
        super().__init__(f"{code}: {message}")

    @property
    def status(self) -> int:
        return self.spec.status

    def as_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"code": self.code, "message": self.message, "field": self.field}
        if self.details:
            body["details"] = self.details
        return body
