"""The bodies of the worker API, one ``TypedDict`` per request and answer, with the wire keys.

Plain dictionaries at run time (a ``TypedDict`` costs nothing once imported), checked by mypy
wherever the agent builds a request or reads an answer, so a misspelt or missing key is a type
error rather than a refusal. Ids are UUID strings and times RFC 3339 strings, as on the wire.
The control plane's DRF serializers (``api/workers/serializers.py``, ``api/leases/serializers.py``)
accept and produce exactly these keys; ``tests/api/test_messages_contract.py`` keeps the two
equal. :data:`REQUESTS` and :data:`ANSWERS` name the shapes of every endpoint of
``protocol.wire``. The protocol on one page: ``docs/protocol.md``.
"""

# No ``from __future__ import annotations`` here: TypedDict reads ``NotRequired`` from evaluated
# annotations only, and ``__required_keys__``/``__optional_keys__`` must be right at run time.
from typing import Any, NotRequired, TypedDict

from . import wire

# --- enrollment and key rotation (docs/transport.md) -------------------------------------------


class Enroll(TypedDict):
    """``POST enroll`` (unsigned): exchange a single-use token for a credential."""

    token: str
    publicKey: str
    workerName: NotRequired[str]
    agentVersion: NotRequired[str]


class EnrollAnswer(TypedDict):
    workerId: str
    workerName: str
    credentialId: str


class Rotate(TypedDict):
    """``POST credential/rotate``, signed by the current key: the new public key."""

    workerId: NotRequired[str]
    publicKey: str


class RotateAnswer(TypedDict):
    credentialId: str
    previousCredentialValidUntil: str


# --- sessions (docs/sessions.md) ----------------------------------------------------------------


class SessionFence(TypedDict):
    """What every session call carries; ``workerId``, if sent, must be the signer's."""

    workerId: NotRequired[str]
    sessionId: str
    generation: int


class Register(TypedDict):
    """``POST session/register``: a new session (a fresh UUIDv7 per process start)."""

    workerId: NotRequired[str]
    sessionId: str
    capabilities: dict[str, Any]
    maxConcurrentRuns: int
    availableSlots: int
    softwareVersion: str
    protocolVersion: int


class SessionTransition(SessionFence):
    """``POST session/drain`` and ``POST session/offline``."""

    expectedVersion: int


class Heartbeat(SessionTransition):
    """``POST session/heartbeat``: ``availableSlots`` is a ceiling, 0 while draining."""

    availableSlots: int


class SessionAnswer(TypedDict):
    """The answer to register, heartbeat, drain and offline: the fence to present next."""

    workerId: str
    sessionId: str
    generation: int
    version: int
    state: str
    maxConcurrentRuns: int
    availableSlots: int
    capabilitiesSha256: str
    leaseExpiresAt: str
    heartbeatIntervalSeconds: int
    nextHeartbeatAt: str
    serverTime: str
    replacedSession: bool
    cancelRequested: list[str]
    rotationRequired: bool


# --- run leases (docs/leases.md) ----------------------------------------------------------------


class OfferRequest(TypedDict):
    """One offer of a claim: the worker's own offer id and lease token."""

    offerId: str
    leaseToken: str


class Claim(SessionFence):
    """``POST claim``: up to ``wire.MAX_OFFERS_PER_CLAIM`` offers."""

    offers: list[OfferRequest]


class ClaimWait(SessionFence):
    """``POST claim/wait`` (docs/leases.md "Waiting claims"): a claim that may wait up to
    ``waitSeconds`` (the server bounds it) for work, for a cancellation of one of the ``watch``
    attempts, or for a change of the session. ``offers`` may be empty (a watch only)."""

    offers: list[OfferRequest]
    watch: list[str]
    waitSeconds: float


class LeaseFence(SessionFence):
    """What every lease call carries."""

    attemptId: str
    leaseGeneration: int
    leaseToken: str


class VersionedLease(LeaseFence):
    """``POST lease/renew`` and ``POST lease/release``."""

    leaseVersion: int


class Ack(VersionedLease):
    """``POST lease/starting``: the activation ACK for the claimed offer."""

    offerId: str


class RunningAck(Ack):
    """``POST lease/running``: the started process."""

    pid: int
    pgid: NotRequired[int | None]
    executorHandle: str


class StartFailed(Ack):
    """``POST lease/start-failed``: ``reason`` is ``executor_start_failed``, ``cancelled``, ``timed_out``."""

    reason: str


class NextClaim(TypedDict):
    """A completion's claim for the slot it frees (docs/leases.md, "The next claim"): offers as
    a claim's, 1 to ``wire.MAX_OFFERS_PER_CLAIM``."""

    offers: list[OfferRequest]


class Complete(LeaseFence):
    """``POST lease/complete``: ``outcome`` is ``succeeded``, ``failed``, ``timed_out`` or ``cancelled``;
    ``next`` claims work for the slot the attempt frees, after the completion committed."""

    sequence: int
    outcome: str
    exitCode: int | None
    stdoutTail: NotRequired[str]
    stderrTail: NotRequired[str]
    next: NotRequired[NextClaim]


class Lease(TypedDict):
    """A run lease as the control plane reports it."""

    attemptId: str
    offerId: str
    leaseGeneration: int
    leaseVersion: int
    expiresAt: str
    renewIntervalSeconds: int


class OutputsSpec(TypedDict):
    """Declared artifacts (docs/logs.md): globs relative to the work directory and their limits."""

    paths: list[str]
    maxFiles: int
    maxFileBytes: int
    maxTotalBytes: int


class ExecutionSpec(TypedDict):
    """``qinglong/execution-spec@v1``: what to run for one attempt (no secrets, no lease token)."""

    kind: str
    runId: str
    attemptId: str
    attemptNumber: int
    taskId: str
    revisionId: str
    revisionNumber: int
    executor: str
    command: str
    env: dict[str, str]
    timeoutSeconds: int
    #: The hard deadline past the run lease's expiry (docs/leases.md, Hard deadline); absent from
    #: older control planes (then 0: the job ends when its lease cannot be renewed).
    lostAfterSeconds: NotRequired[int]
    revisionSha256: str
    outputs: NotRequired[OutputsSpec]
    #: Names of the ``env`` variables whose values are masked in the log (protocol/masking.py);
    #: present only when the revision names some.
    secretEnv: NotRequired[list[str]]


class Offer(TypedDict):
    """One claimed offer: ``status`` is ``claimed``, or ``idempotent`` for a replayed claim."""

    status: str
    lease: Lease
    execution: ExecutionSpec


class ClaimAnswer(TypedDict):
    offers: list[Offer]
    pollAfterSeconds: float


class ClaimWaitAnswer(TypedDict):
    """The answer to a waiting claim: the offers claimed (maybe none), the watched attempts whose
    cancellation was requested, the wait the server granted and how it ended (``offers``,
    ``cancel``, ``session``, ``timeout``, ``shutdown``, ``superseded``), and the session as a
    heartbeat answers it (the wait kept it alive)."""

    offers: list[Offer]
    cancelRequested: list[str]
    waitSeconds: float
    ended: str
    session: SessionAnswer


class AckAnswer(TypedDict):
    """The answer to starting, running, start-failed, renew and release."""

    status: str
    lease: Lease
    cancelRequested: bool


class Refusal(TypedDict):
    """Why a part of a call that was otherwise answered was refused: an error code of the
    catalogue (``protocol.errors``), its message, and the culprit field and details when the
    error names them."""

    code: str
    message: str
    field: NotRequired[str]
    details: NotRequired[dict[str, object]]


class NextClaimAnswer(TypedDict):
    """What a completion's next claim answered: the offers claimed (maybe none), or ``refused``
    with the code a claim would have been refused with (the completion stands either way)."""

    offers: list[Offer]
    refused: NotRequired[Refusal]


class CompleteAnswer(TypedDict):
    attemptId: str
    leaseGeneration: int
    sequence: int
    outcome: str
    next: NotRequired[NextClaimAnswer]


class LogSegment(TypedDict):
    """One stream's bytes in a log chunk: ``offset`` is the agent's monotonic byte offset of the
    first byte within that stream; ``content`` base64 (docs/logs.md)."""

    stream: str
    offset: int
    content: str


class LogChunk(LeaseFence):
    """``POST lease/log``: chunk ``seq`` (from 1 per attempt) of the attempt's output."""

    seq: int
    segments: list[LogSegment]


class LogChunkAnswer(TypedDict):
    status: str  # stored | idempotent | truncated
    nextSeq: int
    intervalSeconds: float
    truncated: bool
    storedBytes: int


class ArtifactPart(LeaseFence):
    """``POST lease/artifact``: one part (in order) of a declared output file (docs/logs.md)."""

    name: str
    size: int
    sha256: str
    offset: int
    content: str


class ArtifactPartAnswer(TypedDict):
    status: str  # receiving | stored | idempotent
    receivedBytes: int
    artifactId: int


#: The request body of every worker endpoint.
REQUESTS: dict[str, type] = {
    wire.ENROLL: Enroll,
    wire.ROTATE_KEY: Rotate,
    wire.SESSION_REGISTER: Register,
    wire.SESSION_HEARTBEAT: Heartbeat,
    wire.SESSION_DRAIN: SessionTransition,
    wire.SESSION_OFFLINE: SessionTransition,
    wire.CLAIM: Claim,
    wire.LEASE_STARTING: Ack,
    wire.LEASE_RUNNING: RunningAck,
    wire.LEASE_START_FAILED: StartFailed,
    wire.LEASE_RENEW: VersionedLease,
    wire.LEASE_RELEASE: VersionedLease,
    wire.LEASE_COMPLETE: Complete,
    wire.LOG_APPEND: LogChunk,
    wire.ARTIFACT_UPLOAD: ArtifactPart,
}

#: The answer body of every worker endpoint.
ANSWERS: dict[str, type] = {
    wire.ENROLL: EnrollAnswer,
    wire.ROTATE_KEY: RotateAnswer,
    wire.SESSION_REGISTER: SessionAnswer,
    wire.SESSION_HEARTBEAT: SessionAnswer,
    wire.SESSION_DRAIN: SessionAnswer,
    wire.SESSION_OFFLINE: SessionAnswer,
    wire.CLAIM: ClaimAnswer,
    wire.LEASE_STARTING: AckAnswer,
    wire.LEASE_RUNNING: AckAnswer,
    wire.LEASE_START_FAILED: AckAnswer,
    wire.LEASE_RENEW: AckAnswer,
    wire.LEASE_RELEASE: AckAnswer,
    wire.LEASE_COMPLETE: CompleteAnswer,
    wire.LOG_APPEND: LogChunkAnswer,
    wire.ARTIFACT_UPLOAD: ArtifactPartAnswer,
}
