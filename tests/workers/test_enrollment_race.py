"""Two machines racing one enrollment token on separate connections: exactly one wins."""

from __future__ import annotations

import threading

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection

from actions.enrollment import enrollment_token_create, worker_create, worker_enroll
from audit.models import Event
from core.errors import DomainError
from protocol.signing import public_key_text
from workers.models import CredentialState, WorkerCredential

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_token_raced_by_two_enrollments_has_exactly_one_winner():
    worker = worker_create(name="raced")
    token = enrollment_token_create(worker_id=worker.pk).token
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def enroll() -> None:
        try:
            key = public_key_text(Ed25519PrivateKey.generate().public_key())
            barrier.wait(timeout=10)
            worker_enroll(token=token, public_key=key)
            outcomes.append("enrolled")
        except DomainError as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=enroll) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["enrolled", "enrollment_token_used"]
    assert WorkerCredential.objects.filter(worker=worker, state=CredentialState.ACTIVE).count() == 1
    assert WorkerCredential.objects.filter(worker=worker).count() == 1
    assert Event.objects.filter(kind="enrollment.refused", data__code="enrollment_token_used").count() == 1
