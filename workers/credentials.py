"""Credential rows and enrollment-token digests: the pieces the identity write paths share (ADR-0012 §1).

No transactions here: the write paths in ``actions.enrollment`` and ``actions.credentials`` call
these inside theirs.
"""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.db import IntegrityError, transaction

from core.db import UniqueRace, is_unique_violation
from protocol.ids import uuid7
from workers.models import (
    CredentialState,
    Worker,
    WorkerCredential,
)
from workers.principals import forget_credentials

TOKEN_PREFIX = "qlenroll_"


def token_digest(token: str) -> str:
    """SHA-256 (hex) of an enrollment token; the only form the database keeps."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def key_in_use(public_key: str) -> bool:
    """Whether any credential, live or dead, ever held this key (keys are never reused)."""
    return WorkerCredential.objects.filter(public_key=public_key).exists()


def forget_credentials_on_commit(credential_ids: list[str]) -> None:
    """Evict these credentials from every process's cache once the transaction commits."""
    transaction.on_commit(lambda: forget_credentials(credential_ids))


def new_credential(worker: Worker, public_key: str, key, now) -> WorkerCredential:
    """Insert an active credential for ``public_key`` (text) whose vetted key object is ``key``.

    ``now``: the database clock. Raises ``UniqueRace`` when the same key was inserted
    concurrently for another worker (the re-run refuses it by field).
    """
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    try:
        return WorkerCredential.objects.create(
            id="wkc_" + uuid7().hex,
            worker=worker,
            public_key=public_key,
            fingerprint=hashlib.sha256(raw).hexdigest(),
            state=CredentialState.ACTIVE,
            created_at=now,
        )
    except IntegrityError as exc:
        # The same key enrolled for another worker at the same moment (the two transactions lock
        # different worker rows): the re-run sees it taken and refuses it by field.
        if is_unique_violation(exc):
            raise UniqueRace("public key inserted concurrently") from exc
        raise
