"""Key rotation: a worker installs a new key, or an operator forces it to (ADR-0012 §1, §2;
``docs/transport.md``).

A rotation, signed by the current key, installs a new key and leaves the old one valid only for
``ROTATION_GRACE_SECONDS``. Every change evicts the credential cache once it commits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from audit.models import ActorType
from audit.recorder import record
from core.conf import protocol
from core.db import db_now, write_path
from core.errors import DomainError
from protocol.signing import public_key_text
from workers.credentials import (
    forget_credentials_on_commit,
    key_in_use,
    new_credential,
)
from workers.keys import worker_public_key
from workers.locks import lock_worker
from workers.models import (
    CredentialState,
    Worker,
    WorkerCredential,
    WorkerState,
)


@dataclass(frozen=True)
class Rotation:
    """A completed rotation: the new credential, and when the previous key stops working.

    ``replayed`` is True when the same rotation was asked for again (a lost answer): nothing
    was written and the answer is the first one's.
    """

    credential: WorkerCredential
    previous_valid_until: datetime
    replayed: bool = False


@write_path
def credential_rotate(*, worker_id: uuid.UUID, credential_id: str, public_key: str) -> Rotation:
    """Install a new public key for a worker, signed by its current key (ADR-0012 §2 takeover rule).

    Arguments: ``worker_id`` and ``credential_id`` come from the authenticated principal (the
    key that signed the request); ``public_key`` is the new raw 32-byte Ed25519 key, base64url.

    Only the worker's *newest* credential may rotate: the active one, or — after an operator
    forced a rotation (:func:`credential_force_rotation`) — the rotated one still inside its
    grace period, as long as nothing newer exists. The calling key then works only until
    now + ``ROTATION_GRACE_SECONDS`` (never longer than a grace it already had) and is refused
    with ``credential_expired`` afterwards. Asking again with the same new key from the key that
    rotated is an exact replay (a lost answer): same credential, nothing written.

    Locks: the worker row. Writes: the two credential rows, ``rotation_required`` cleared, a
    ``credential.rotated`` event; evicts the old key from the credential cache on commit.
    Raises: ``validation_failed`` (``publicKey`` malformed, or already used by any credential),
    ``worker_not_found``, ``worker_revoked``, ``credential_revoked``/``credential_expired``
    (the calling key is dead), ``credential_superseded`` (a newer credential exists).
    """
    key = worker_public_key(public_key)
    public_key = public_key_text(key)
    worker = lock_worker(worker_id)
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "the worker is revoked")
    now = db_now()
    live = list(
        WorkerCredential.objects.filter(worker=worker)
        .exclude(state=CredentialState.REVOKED)
        .order_by("-created_at", "-pk")
    )
    caller = next((credential for credential in live if credential.pk == credential_id), None)
    if caller is None:
        raise DomainError("credential_revoked", "the signing credential was revoked")
    # A rotated credential always has its grace end (constraint rotated_credential_has_grace_end);
    # were it missing, the key would be refused rather than valid for ever.
    if caller.state == CredentialState.ROTATED and (caller.not_after is None or caller.not_after <= now):
        raise DomainError("credential_expired", "the signing credential's grace period is over")
    newest = live[0]
    if newest.pk != caller.pk:
        # A replay: the newest credential is this caller's own rotation, so the caller is the
        # rotated key and has its grace end.
        if newest.public_key == public_key and live[1].pk == caller.pk and caller.not_after is not None:
            return Rotation(credential=newest, previous_valid_until=caller.not_after, replayed=True)
        raise DomainError(
            "credential_superseded",
            "a newer credential exists; only the newest key may rotate",
            field="publicKey",
        )
    if key_in_use(public_key):
        raise DomainError("validation_failed", "this key was already used by a credential", field="publicKey")
    grace = protocol().rotation_grace_seconds
    valid_until = now + timedelta(seconds=grace)
    if caller.not_after is not None:
        valid_until = min(valid_until, caller.not_after)  # a forced rotation's grace is not extended
    WorkerCredential.objects.filter(pk=caller.pk).update(state=CredentialState.ROTATED, not_after=valid_until)
    credential = new_credential(worker, public_key, key, now)
    Worker.objects.filter(pk=worker.pk).update(rotation_required=False)
    forced = caller.state == CredentialState.ROTATED
    record(
        "credential.rotated",
        actor_type=ActorType.WORKER,
        actor=worker.name,
        worker_id=worker.pk,
        data={"grace_s": int((valid_until - now).total_seconds()), "forced": forced},
    )
    forget_credentials_on_commit([caller.pk])
    return Rotation(credential=credential, previous_valid_until=valid_until)


@write_path
def credential_force_rotation(*, worker_id: uuid.UUID, actor: str = "") -> Worker:
    """Operator: require the worker to rotate its key within the grace period (ADR-0012 §2).

    The active credential becomes ``rotated`` with ``not_after`` = now + ``ROTATION_GRACE_SECONDS``
    and the worker is flagged; the agent learns it from ``rotationRequired`` in its next
    heartbeat answer and rotates with that key (:func:`credential_rotate`). A worker that misses
    the window gets ``credential_expired`` and must be re-enrolled. Forcing again while a forced
    rotation is pending changes nothing.

    Locks: the worker row. Writes: the credential, the worker's flag, a
    ``credential.rotation_forced`` event; evicts the credential cache on commit.
    Raises: ``worker_not_found``, ``worker_revoked``, ``worker_not_enrolled`` (no active key).
    """
    worker = lock_worker(worker_id)
    if worker.state == WorkerState.REVOKED:
        raise DomainError("worker_revoked", "the worker is revoked")
    now = db_now()
    grace = protocol().rotation_grace_seconds
    ids = list(
        WorkerCredential.objects.filter(worker=worker, state=CredentialState.ACTIVE).values_list(
            "pk", flat=True
        )
    )
    if not ids:
        if worker.rotation_required:
            return worker
        raise DomainError("worker_not_enrolled", "the worker has no active credential to rotate")
    WorkerCredential.objects.filter(pk__in=ids).update(
        state=CredentialState.ROTATED, not_after=now + timedelta(seconds=grace)
    )
    Worker.objects.filter(pk=worker.pk).update(rotation_required=True)
    record(
        "credential.rotation_forced",
        actor_type=ActorType.OPERATOR,
        actor=actor,
        worker_id=worker.pk,
        data={"grace_s": grace},
    )
    forget_credentials_on_commit(ids)
    worker.refresh_from_db()
    return worker
