"""Run write paths: enqueue, cancel, retry scheduling and requeue (docs/leases.md, States)."""

from __future__ import annotations

import pytest

from actions.runs import run_cancel, run_requeue, sweep_due_retries
from actions.tasks import task_create
from audit.models import Event
from core.errors import DomainError
from runs.models import Run, RunAttempt
from runs.outcomes import retry_delay_seconds
from runs.revisions import RevisionSpec
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import claim_one, complete, make_retry_due, start

pytestmark = pytest.mark.django_db


def kinds(run_id) -> list[str]:
    return list(Event.objects.filter(run_id=run_id).order_by("id").values_list("kind", flat=True))


def test_enqueue_pins_the_revision_and_queues_attempt_1():
    revision = make_revision(command="echo 1")
    run = enqueue(revision, priority=7)
    run.refresh_from_db()
    assert (run.state, run.revision_id, run.attempt_count, run.priority, run.version) == (
        "queued",
        revision.pk,
        1,
        7,
        1,
    )
    attempt = RunAttempt.objects.get(run=run)
    assert (attempt.number, attempt.state, attempt.priority, attempt.lease_generation) == (1, "claimed", 7, 0)
    assert kinds(run.pk) == ["run.created", "run.queued", "attempt.claimed"]


@pytest.mark.parametrize("priority", [-101, 101])
def test_enqueue_refuses_an_out_of_range_priority_naming_the_field(priority):
    with pytest.raises(DomainError) as refused:
        enqueue(make_revision(), priority=priority)
    assert (refused.value.code, refused.value.field) == ("validation_failed", "priority")
    assert not Run.objects.exists()


def test_cancelling_a_pending_run_cancels_it_and_its_attempt_at_once():
    run = enqueue(make_revision())
    result = run_cancel(run_id=run.pk, reason="not needed")
    assert result.status == "requested"
    run.refresh_from_db()
    assert run.state == "cancelled" and run.cancel_reason == "not needed" and run.finished_at is not None
    assert RunAttempt.objects.get(run=run).state == "cancelled"
    assert kinds(run.pk)[-3:] == ["run.cancel_requested", "attempt.cancelled", "run.cancelled"]
    before = Event.objects.count()
    assert run_cancel(run_id=run.pk).status == "already_terminal"
    assert Event.objects.count() == before


def test_a_second_cancel_of_a_running_run_is_already_requested_and_writes_nothing():
    session = register(enrolled_worker())
    run = enqueue(make_revision())
    start(claim_one(session))
    assert run_cancel(run_id=run.pk).status == "requested"
    run.refresh_from_db()
    assert run.state == "running" and run.cancel_requested_at is not None
    before = (Event.objects.count(), Run.objects.get(pk=run.pk).version)
    assert run_cancel(run_id=run.pk).status == "already_requested"
    assert (Event.objects.count(), Run.objects.get(pk=run.pk).version) == before


def test_cancel_refuses_a_long_reason_and_an_unknown_run():
    run = enqueue(make_revision())
    with pytest.raises(DomainError) as refused:
        run_cancel(run_id=run.pk, reason="x" * 201)
    assert (refused.value.code, refused.value.field) == ("validation_failed", "reason")
    with pytest.raises(DomainError) as missing:
        run_cancel(run_id=RunAttempt.objects.get(run=run).pk)
    assert missing.value.code == "run_not_found"


@pytest.fixture
def waiting():
    """A run in retry_wait after its first attempt failed (retry_on failed, two attempts)."""
    session = register(enrolled_worker())
    run = enqueue(
        make_revision(
            max_attempts=2, retry_on=("failed",), retry_backoff_seconds=30, retry_backoff_max_seconds=60
        )
    )
    complete(start(claim_one(session)), outcome="failed", exit_code=2)
    run.refresh_from_db()
    assert run.state == "retry_wait"
    return session, run


def test_a_failed_attempt_waits_an_absolute_jittered_backoff(waiting):
    _, run = waiting
    finished = RunAttempt.objects.get(run=run, number=1).finished_at
    delay = (run.next_attempt_at - finished).total_seconds()
    assert 15 <= delay <= 30  # equal jitter: the upper half of min(max, base · 2^(n−1)) = 30 s
    assert sweep_due_retries() == 0  # not due yet: nothing is queued
    assert Run.objects.get(pk=run.pk).state == "retry_wait"


def test_a_due_retry_is_queued_as_attempt_2_sharing_nothing_with_attempt_1(waiting):
    session, run = waiting
    make_retry_due(run.pk)
    assert sweep_due_retries() == 1
    run.refresh_from_db()
    assert (run.state, run.attempt_count, run.next_attempt_at) == ("queued", 2, None)
    second = RunAttempt.objects.get(run=run, number=2)
    assert (second.state, second.worker_id, second.session_id, second.lease_generation, second.pid) == (
        "claimed",
        None,
        None,
        0,
        None,
    )
    assert kinds(run.pk)[-2:] == ["run.queued", "attempt.claimed"]
    held = start(claim_one(session))
    assert held.attempt_id == second.pk and held.lease_generation == 1
    complete(held)
    run.refresh_from_db()
    assert run.state == "succeeded" and run.exit_code == 0


def test_cancelling_a_waiting_run_cancels_it_at_once_and_no_attempt_follows(waiting):
    _, run = waiting
    run_cancel(run_id=run.pk)
    run.refresh_from_db()
    assert (run.state, run.next_attempt_at) == ("cancelled", None)
    assert run_requeue(run_id=run.pk) is None
    assert RunAttempt.objects.filter(run=run).count() == 1


def test_requeue_of_a_run_that_is_not_due_writes_nothing(waiting):
    _, run = waiting
    before = (Event.objects.count(), Run.objects.get(pk=run.pk).version)
    assert run_requeue(run_id=run.pk) is None
    assert (Event.objects.count(), Run.objects.get(pk=run.pk).version) == before


def test_the_retry_sweep_works_in_bounded_batches():
    session = register(enrolled_worker(), max_concurrent=3)
    revision = make_revision(max_attempts=2, retry_on=("failed",))
    runs = [enqueue(revision) for _ in range(3)]
    for _ in runs:
        complete(start(claim_one(session)), outcome="failed", exit_code=1)
    for run in runs:
        make_retry_due(run.pk)
    assert sweep_due_retries(batch=2) == 2
    assert sweep_due_retries(batch=2) == 1
    assert sweep_due_retries(batch=2) == 0
    assert set(Run.objects.values_list("state", flat=True)) == {"queued"}


def test_backoff_doubles_per_attempt_up_to_its_ceiling():
    revision = make_revision(max_attempts=10, retry_backoff_seconds=10, retry_backoff_max_seconds=45)
    for number, ceiling in [(1, 10), (2, 20), (3, 40), (4, 45), (9, 45)]:
        delays = [retry_delay_seconds(revision, number) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), number


def test_a_run_that_stops_waiting_drops_its_placement_summary():
    run = enqueue(make_revision(placement={"required": {"arch": ["aarch64"]}}))
    Run.objects.filter(pk=run.pk).update(placement_summary={"arch": 1})
    run_cancel(run_id=run.pk, reason="not needed")
    run.refresh_from_db()
    assert (run.state, run.placement_summary) == ("cancelled", None)


def test_a_hostile_env_name_is_named_safely_in_the_error():
    spec = RevisionSpec(
        executor="shell", command="true", timeout_seconds=5, env={"\x00bad" + "x" * 5000: "v"}
    )
    with pytest.raises(DomainError) as refused:
        task_create(name="env-check", spec=spec)
    assert refused.value.field.startswith("env.") and len(refused.value.field) <= 80
    assert "\x00" not in refused.value.field
