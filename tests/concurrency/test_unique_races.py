"""Unique names and keys under real races: one winner, the others a clean 4xx naming the field.

Each contender runs on its own thread and database connection, released by a barrier.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from actions.enrollment import enrollment_token_create, worker_create, worker_enroll
from actions.tasks import task_create
from core.errors import DomainError
from protocol.signing import public_key_text
from runs.models import Task
from runs.revisions import RevisionSpec
from tests.concurrency.threads import race
from workers.models import WorkerCredential

pytestmark = pytest.mark.django_db(transaction=True)


def _outcomes(results):
    winners = [value for kind, value in results if kind == "ok"]
    refusals = [value for kind, value in results if kind == "error"]
    assert all(isinstance(error, DomainError) for error in refusals), refusals
    return winners, refusals


@pytest.mark.parametrize("round_", range(5))
def test_racing_task_creations_of_one_name_have_one_winner(round_):
    spec = RevisionSpec(executor="shell", command="true", timeout_seconds=5)
    results = race(*[lambda: task_create(name=f"same-{round_}", spec=spec)] * 8)
    winners, refusals = _outcomes(results)
    assert len(winners) == 1 and Task.objects.filter(name=f"same-{round_}").count() == 1
    assert {(e.code, e.field) for e in refusals} == {("validation_failed", "name")}


@pytest.mark.parametrize("round_", range(5))
def test_one_key_raced_into_four_enrollments_is_held_once(round_):
    key = public_key_text(Ed25519PrivateKey.generate().public_key())
    tokens = []
    for index in range(4):
        worker = worker_create(name=f"keyrace-{round_}-{index}")
        tokens.append(enrollment_token_create(worker_id=worker.pk).token)
    results = race(*[lambda token=token: worker_enroll(token=token, public_key=key) for token in tokens])
    winners, refusals = _outcomes(results)
    assert len(winners) == 1 and WorkerCredential.objects.filter(public_key=key).count() == 1
    assert {(e.code, e.field) for e in refusals} == {("validation_failed", "publicKey")}
