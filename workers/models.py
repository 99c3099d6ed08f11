"""Workers, their credentials and enrollment tokens, and their sessions (ADR-0012 §1, §2).

A *worker* is an enrolled machine; a *session* is one process start on it. Each process start
registers a new session (a worker-generated UUIDv7) which atomically replaces the worker's
current session: ``generation`` increases by one per session and a new session's ``version``
starts above its predecessor's, so both only ever increase across the worker's life (the newest
session by generation carries the highest of each; nothing else stores them). The session lease
(``lease_expires_at``) only says "this node recently reported status and capacity"; it
authorises no run (run leases live in ``leases``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.lookups import one_of
from protocol.ids import uuid7


class WorkerState(models.TextChoices):
    """Administrative state; survives process restarts (a new session inherits it)."""

    ACTIVE = "active"
    DRAINING = "draining"  # operator drain: sessions start draining, take no new runs
    REVOKED = "revoked"  # credentials dead, sessions fenced, nothing accepted from it again


class Worker(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(max_length=16, choices=WorkerState.choices, default=WorkerState.ACTIVE)
    drain_requested_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    rotation_required = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        # The operator acts on a worker (docs/operators.md); ``accounts.roles`` grants them.
        permissions = [
            ("issue_enrollment_token", "Can issue an enrollment token (re-enrolls the worker)"),
            ("drain_worker", "Can drain and undrain a worker"),
            ("revoke_worker", "Can revoke a worker"),
            ("rotate_worker_credential", "Can force a worker's key rotation"),
            ("force_offline_worker", "Can force a worker's session offline"),
        ]
        constraints = [
            models.CheckConstraint(condition=one_of("state", WorkerState.values), name="worker_state_valid"),
            models.CheckConstraint(
                condition=~Q(state=WorkerState.REVOKED) | Q(revoked_at__isnull=False),
                name="worker_revoked_has_time",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class CredentialState(models.TextChoices):
    ACTIVE = "active"
    ROTATED = "rotated"  # superseded by a rotation; valid until not_after (grace period)
    REVOKED = "revoked"


class WorkerCredential(models.Model):
    """An Ed25519 public key a worker proves possession of on every request (ADR-0012 §1).

    The private key never leaves the worker. ``id`` is the RFC 9421 ``keyid``.
    """

    id = models.CharField(primary_key=True, max_length=40, editable=False)
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="credentials")
    #: Unique: a key is never held by two credentials (ever), which also makes two concurrent
    #: enrollments of one key for two workers a clean conflict rather than two winners.
    public_key = models.CharField(
        max_length=64, unique=True, editable=False, help_text="raw Ed25519 key, base64url"
    )
    fingerprint = models.CharField(max_length=64, editable=False, help_text="SHA-256 of the raw key, hex")
    state = models.CharField(max_length=16, choices=CredentialState.choices, default=CredentialState.ACTIVE)
    created_at = models.DateTimeField(editable=False)
    not_after = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoke_reason = models.CharField(max_length=32, blank=True, default="", editable=False)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=one_of("state", CredentialState.values), name="credential_state_valid"
            ),
            models.UniqueConstraint(
                fields=["worker"],
                condition=Q(state=CredentialState.ACTIVE),
                name="one_active_credential_per_worker",
            ),
            models.CheckConstraint(
                condition=~Q(state=CredentialState.ROTATED) | Q(not_after__isnull=False),
                name="rotated_credential_has_grace_end",
            ),
        ]

    def __str__(self) -> str:
        return self.id


class EnrollmentToken(models.Model):
    """A single-use, expiring secret an operator hands to a machine; stored only as a digest."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="enrollment_tokens")
    digest = models.CharField(
        max_length=64, unique=True, editable=False, help_text="SHA-256 of the token, hex"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(editable=False)
    expires_at = models.DateTimeField(editable=False)
    used_at = models.DateTimeField(null=True, blank=True, editable=False)
    used_by_credential = models.CharField(max_length=40, blank=True, default="", editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"enrollment token for {self.worker_id}"


class SessionState(models.TextChoices):
    ONLINE = "online"
    DRAINING = "draining"  # heartbeats valid, capacity zero, no new claims
    OFFLINE = "offline"  # the worker said goodbye (or an operator forced it)
    FENCED = "fenced"  # replaced by a newer session, or the worker was revoked
    EXPIRED = "expired"  # its lease lapsed (marked by the sweep; invisible before that already)


LIVE_SESSION_STATES = (SessionState.ONLINE, SessionState.DRAINING)


class WorkerSession(models.Model):
    id = models.UUIDField(primary_key=True, editable=False, help_text="worker-generated UUIDv7")
    #: PROTECT: a session row outlives any wish to delete its worker (its leases and attempts
    #: point at it); a worker is revoked, never deleted once it has registered. No index of its
    #: own: ``session_generation_unique`` (worker, generation) serves every lookup by worker.
    worker = models.ForeignKey(Worker, on_delete=models.PROTECT, related_name="sessions", db_index=False)
    generation = models.PositiveBigIntegerField(editable=False)
    version = models.PositiveBigIntegerField(editable=False)
    state = models.CharField(max_length=16, choices=SessionState.choices, editable=False)
    end_reason = models.CharField(max_length=32, blank=True, default="", editable=False)
    #: Who asked for the drain ("worker" on shutdown, "operator" from the admin); "" if none.
    drained_by = models.CharField(max_length=16, blank=True, default="", editable=False)
    capabilities = models.TextField(editable=False, help_text="RFC 8785 canonical JSON")
    capabilities_sha256 = models.CharField(max_length=64, editable=False)
    max_concurrent_runs = models.PositiveSmallIntegerField(editable=False)
    available_slots = models.PositiveSmallIntegerField(editable=False)
    software_version = models.CharField(max_length=64, editable=False)
    protocol_version = models.PositiveSmallIntegerField(editable=False)
    #: SHA-256 over everything registration fixed; an identical re-registration is a replay.
    registration_sha256 = models.CharField(max_length=64, editable=False)
    registered_at = models.DateTimeField(editable=False)
    lease_expires_at = models.DateTimeField(editable=False)
    ended_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-registered_at"]
        constraints = [
            models.CheckConstraint(
                condition=one_of("state", SessionState.values), name="session_state_valid"
            ),
            models.UniqueConstraint(fields=["worker", "generation"], name="session_generation_unique"),
            models.UniqueConstraint(
                fields=["worker"],
                condition=Q(state__in=LIVE_SESSION_STATES),
                name="one_live_session_per_worker",
            ),
            models.CheckConstraint(
                condition=Q(available_slots__lte=models.F("max_concurrent_runs")), name="slots_within_maximum"
            ),
            models.CheckConstraint(
                condition=~Q(state=SessionState.DRAINING) | Q(available_slots=0),
                name="draining_has_no_capacity",
            ),
            models.CheckConstraint(condition=Q(generation__gte=1), name="session_generation_positive"),
        ]
        # No index covers lease_expires_at, on purpose: a heartbeat that extends the lease then
        # changes no indexed column and PostgreSQL can update the row in place (a HOT update, with
        # fillfactor room left by migration 0002), which costs about a third of the WAL. Live
        # sessions — the only ones any query asks about expiry — are found through the partial
        # unique index one_live_session_per_worker (one row per worker at most).

    def __str__(self) -> str:
        return f"{self.worker_id} gen {self.generation}"

    @property
    def is_live_state(self) -> bool:
        return self.state in LIVE_SESSION_STATES


class ReplayNonce(models.Model):
    """One accepted signature nonce (standalone profile; the cluster profile keeps them in Redis).

    ``key`` is ``<keyid>:<nonce>``; ``expires_at`` is unix seconds, after which no signature
    carrying the nonce can be fresh. Insert-or-fail is the replay check (``workers.nonces``); the
    sweep deletes expired rows. Survives restarts, so a restart refuses nothing fresh.
    """

    key = models.CharField(max_length=200, primary_key=True)
    expires_at = models.BigIntegerField(db_index=True)

    def __str__(self) -> str:
        return self.key
