"""Key rotation (ADR-0012 §2 takeover rule): signed by the current key, the old key lives only for
the documented grace period, only the newest key may rotate, operators can force a rotation."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from actions.credentials import credential_force_rotation, credential_rotate
from actions.enrollment import worker_create
from audit.models import Event
from core.errors import DomainError
from protocol import wire
from protocol.signing import public_key_text
from tests.helpers import SignedClient, enrolled_worker, heartbeat, register
from workers.models import CredentialState, Worker, WorkerCredential
from workers.principals import forget_credentials

pytestmark = pytest.mark.django_db


def key_text(key: Ed25519PrivateKey) -> str:
    return public_key_text(key.public_key())


def end_grace(credential_id: str) -> None:
    """Move the grace period's end into the past the way time would (the database's notion of
    it), and evict the cache as every write path does on commit."""
    WorkerCredential.objects.filter(pk=credential_id).update(not_after=timezone.now() - timedelta(seconds=1))
    forget_credentials([credential_id])


@pytest.fixture
def rotating(client, django_capture_on_commit_callbacks):
    worker = enrolled_worker()
    session = register(worker)
    old = SignedClient(client, worker)
    assert old.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200
    new_key = Ed25519PrivateKey.generate()
    with django_capture_on_commit_callbacks(execute=True):
        answer = old.post(wire.ROTATE_KEY, {"publicKey": key_text(new_key)})
    assert answer.status_code == 201, answer.json()
    worker_new = type(worker)(worker.worker_id, worker.name, answer.json()["credentialId"], new_key)
    return worker, session, old, SignedClient(client, worker_new), answer.json(), new_key


def test_rotation_installs_the_new_key_and_keeps_the_old_for_the_grace_period(rotating, protocol_settings):
    worker, session, old, new, answer, _ = rotating
    assert new.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200
    assert old.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200  # inside the grace period
    previous = WorkerCredential.objects.get(pk=worker.credential_id)
    assert previous.state == CredentialState.ROTATED
    until = parse_datetime(answer["previousCredentialValidUntil"])
    assert until == previous.not_after
    grace = (
        previous.not_after - WorkerCredential.objects.get(pk=answer["credentialId"]).created_at
    ).total_seconds()
    assert abs(grace - 300) < 2  # ROTATION_GRACE_SECONDS, default 5 minutes
    assert Event.objects.filter(kind="credential.rotated", worker_id=worker.worker_id).count() == 1


def test_after_the_grace_period_the_old_key_is_refused(rotating):
    worker, session, old, new, _, _ = rotating
    end_grace(worker.credential_id)
    answer = old.post(wire.SESSION_HEARTBEAT, heartbeat(session))
    assert (answer.status_code, answer.json()["code"]) == (401, "credential_expired")
    assert new.post(wire.SESSION_HEARTBEAT, heartbeat(session)).status_code == 200


def test_the_grace_period_is_a_setting(client, protocol_settings):
    protocol_settings(ROTATION_GRACE_SECONDS=42)
    worker = enrolled_worker()
    rotation = credential_rotate(
        worker_id=worker.worker_id,
        credential_id=worker.credential_id,
        public_key=key_text(Ed25519PrivateKey.generate()),
    )
    created = rotation.credential.created_at
    assert abs((rotation.previous_valid_until - created).total_seconds() - 42) < 1


def test_only_the_newest_key_may_rotate(rotating):
    _, _, old, new, answer, new_key = rotating
    other = old.post(wire.ROTATE_KEY, {"publicKey": key_text(Ed25519PrivateKey.generate())})
    assert (other.status_code, other.json()["code"]) == (409, "credential_superseded")
    # the same rotation asked again (its answer was lost) is an exact replay
    replay = old.post(wire.ROTATE_KEY, {"publicKey": key_text(new_key)})
    assert replay.status_code == 200 and replay.json() == answer
    assert WorkerCredential.objects.filter(worker_id=old.worker.worker_id).count() == 2


def test_a_key_cannot_rotate_to_itself_or_to_a_used_key(client):
    worker = enrolled_worker()
    api = SignedClient(client, worker)
    same = api.post(wire.ROTATE_KEY, {"publicKey": key_text(worker.key)})
    assert (same.status_code, same.json()["field"]) == (400, "publicKey")
    other = enrolled_worker()
    used = api.post(wire.ROTATE_KEY, {"publicKey": key_text(other.key)})
    assert (used.status_code, used.json()["field"]) == (400, "publicKey")


def test_an_operator_forced_rotation_is_announced_and_carried_out_with_the_current_key(
    client, django_capture_on_commit_callbacks
):
    worker = enrolled_worker()
    session = register(worker)
    api = SignedClient(client, worker)
    assert api.post(wire.SESSION_HEARTBEAT, heartbeat(session)).json()["rotationRequired"] is False
    with django_capture_on_commit_callbacks(execute=True):
        credential_force_rotation(worker_id=worker.worker_id, actor="alice")
    forced = WorkerCredential.objects.get(pk=worker.credential_id)
    assert forced.state == CredentialState.ROTATED and forced.not_after is not None
    told = api.post(wire.SESSION_HEARTBEAT, heartbeat(session))
    assert told.status_code == 200 and told.json()["rotationRequired"] is True
    new_key = Ed25519PrivateKey.generate()
    rotated = api.post(wire.ROTATE_KEY, {"publicKey": key_text(new_key)})
    assert rotated.status_code == 201, rotated.json()
    # a forced rotation's grace is not extended by carrying it out
    assert parse_datetime(rotated.json()["previousCredentialValidUntil"]) == forced.not_after
    new = SignedClient(
        client, type(worker)(worker.worker_id, worker.name, rotated.json()["credentialId"], new_key)
    )
    assert new.post(wire.SESSION_HEARTBEAT, heartbeat(session)).json()["rotationRequired"] is False
    assert Worker.objects.get(pk=worker.worker_id).rotation_required is False


def test_a_worker_that_misses_a_forced_rotation_is_refused(client, django_capture_on_commit_callbacks):
    worker = enrolled_worker()
    session = register(worker)
    with django_capture_on_commit_callbacks(execute=True):
        credential_force_rotation(worker_id=worker.worker_id)
    end_grace(worker.credential_id)
    answer = SignedClient(client, worker).post(wire.SESSION_HEARTBEAT, heartbeat(session))
    assert (answer.status_code, answer.json()["code"]) == (401, "credential_expired")


def test_forcing_needs_an_enrolled_worker_and_is_idempotent():
    bare = worker_create(name="never-enrolled")
    with pytest.raises(DomainError) as refused:
        credential_force_rotation(worker_id=bare.pk)
    assert refused.value.code == "worker_not_enrolled"
    worker = enrolled_worker()
    credential_force_rotation(worker_id=worker.worker_id)
    first = WorkerCredential.objects.get(pk=worker.credential_id).not_after
    credential_force_rotation(worker_id=worker.worker_id)
    assert WorkerCredential.objects.get(pk=worker.credential_id).not_after == first
    assert Event.objects.filter(kind="credential.rotation_forced").count() == 1


def test_the_command_and_the_admin_action_force_rotation(admin_client):
    by_command, by_admin = enrolled_worker(), enrolled_worker()
    out = io.StringIO()
    call_command("worker_admin", "rotate", by_command.name, stdout=out)
    assert Worker.objects.get(pk=by_command.worker_id).rotation_required
    answer = admin_client.post(
        "/admin/workers/worker/",
        {"action": "force_rotation", "_selected_action": [str(by_admin.worker_id)]},
        follow=True,
    )
    assert answer.status_code == 200
    assert Worker.objects.get(pk=by_admin.worker_id).rotation_required
    assert WorkerCredential.objects.get(pk=by_admin.credential_id).state == CredentialState.ROTATED
