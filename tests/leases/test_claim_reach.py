"""A claim reaches work its worker can run, however much work it cannot run waits ahead of it."""

from __future__ import annotations

import pytest

from runs import selectors
from runs.models import RunAttempt
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim

pytestmark = pytest.mark.django_db


def test_a_run_behind_hundreds_of_unplaceable_runs_is_claimed_at_once():
    blocked = make_revision(placement={"required": {"arch": ["aarch64"]}})
    for _ in range(300):  # more than a claim's page budget (16 + 3 x 64)
        enqueue(blocked, priority=10)
    runnable = enqueue(make_revision(), priority=0)
    session = register(enrolled_worker())  # x86_64
    [held] = claim(session)
    assert RunAttempt.objects.get(pk=held.attempt_id).run_id == runnable.pk


def test_every_placement_class_is_reached_in_turn_when_there_are_more_than_a_claim_looks_at(monkeypatch):
    monkeypatch.setattr(selectors, "MAX_PLACEMENT_CLASSES", 4)
    for index in range(12):  # twelve classes nobody here can run
        enqueue(make_revision(placement={"required": {"labels": {"pool": f"p{index}"}}}), priority=10)
    runnable = enqueue(make_revision())
    session = register(enrolled_worker())
    for _ in range(60):  # a random starting point each claim: the class comes up soon enough
        held = claim(session)
        if held:
            assert RunAttempt.objects.get(pk=held[0].attempt_id).run_id == runnable.pk
            return
    pytest.fail("the runnable class was never reached")


def test_class_discovery_is_a_bounded_index_scan():
    for index in range(5):
        revision = make_revision(placement={"required": {"labels": {"pool": f"q{index}"}}})
        for _ in range(3):
            enqueue(revision)
    classes = selectors.waiting_placement_classes()
    assert len(classes) == 5 and classes == sorted(classes)
    assert selectors.waiting_placement_classes(limit=2) == classes[:2]
    wrapped = selectors.waiting_placement_classes(start=classes[3], limit=5)
    assert wrapped == classes[3:] + classes[:3]
