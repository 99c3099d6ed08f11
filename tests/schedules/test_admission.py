"""Admission of due fires: one run per fire, the run names its schedule and fire time, misfire
and overlap policies exactly as ``docs/schedules.md`` documents them. Time moves by moving the
schedule's fire times in the database."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.contrib.auth import get_user_model

from actions.runs import run_cancel
from actions.schedules import schedule_admit, sweep_due_schedules
from actions.sweeps import run_cycle
from audit.models import Event
from core.db import db_now
from runs.models import Run
from schedules.models import Schedule, ScheduleFire
from tests.helpers import enqueue, make_revision
from tests.schedules.flows import fires_between, hourly_fired_ago, make_schedule, rewind

pytestmark = pytest.mark.django_db


def floor_minute(instant):
    return instant.replace(second=0, microsecond=0)


def due_now(revision, **settings):
    """A schedule that fires once an hour, whose fire of a moment ago is due (the next is an hour away)."""
    expression, fire_at = hourly_fired_ago(1)
    return rewind(make_schedule(revision, expression, **settings), fire_at), fire_at


def test_a_new_schedule_waits_for_its_first_fire_after_now():
    schedule = make_schedule(make_revision(), "* * * * *")
    now = db_now()
    assert now < schedule.next_fire_at <= floor_minute(now) + timedelta(minutes=1)
    assert schedule.due_at == schedule.next_fire_at
    assert sweep_due_schedules() == 0
    assert not Run.objects.exists()


def test_a_due_fire_becomes_exactly_one_run_that_records_its_schedule_and_fire_time():
    revision = make_revision()
    schedule, fire_at = due_now(revision, priority=5)

    assert run_cycle().schedule_fires == 1
    assert sweep_due_schedules() == 0  # decided: nothing more until the next minute

    run = Run.objects.get()
    assert (run.revision_id, run.state, run.priority, run.created_by) == (
        revision.pk,
        "queued",
        5,
        f"schedule:{schedule.pk}",
    )
    fire = run.schedule_fire
    assert (fire.schedule_id, fire.fire_at, fire.outcome, fire.fires) == (schedule.pk, fire_at, "queued", 1)
    schedule.refresh_from_db()
    assert (schedule.last_fire_at, schedule.last_run_id, schedule.last_outcome) == (fire_at, run.pk, "queued")
    assert schedule.next_fire_at == fire_at + timedelta(hours=1)
    created = Event.objects.get(kind="run.created", run_id=run.pk)
    assert (created.actor_type, created.data) == (
        "scheduler",
        {"schedule": str(schedule.pk), "fireAt": fire_at.isoformat()},
    )
    fired = Event.objects.get(kind="schedule.fired")
    assert (fired.run_id, fired.data["outcome"]) == (run.pk, "queued")


def test_admitting_again_never_makes_a_second_run_for_the_same_fire():
    schedule, _ = due_now(make_revision(), overlap="allow")
    first = schedule_admit(schedule_id=schedule.pk)
    assert first is not None and first.outcome == "queued"
    # A replica that read the schedule before that decision and comes in afterwards:
    assert schedule_admit(schedule_id=schedule.pk) is None
    assert Run.objects.count() == ScheduleFire.objects.count() == 1


def test_several_fires_due_within_the_grace_each_get_their_own_run():
    schedule = make_schedule(make_revision(), "*/10 * * * * *", overlap="allow", misfire_grace_seconds=600)
    first = db_now().replace(microsecond=0) - timedelta(seconds=60)
    first = first.replace(second=first.second - first.second % 10)
    rewind(schedule, first)
    decided = sweep_due_schedules()
    fired = sorted(ScheduleFire.objects.values_list("fire_at", flat=True))
    assert decided == len(fired) >= 6
    assert fired == fires_between(schedule, first, fired[-1])  # each one, none skipped
    assert set(ScheduleFire.objects.values_list("outcome", flat=True)) == {"queued"}
    assert Run.objects.count() == decided


def test_the_sweep_is_bounded_per_call():
    schedule = make_schedule(make_revision(), "* * * * * *", overlap="allow", misfire_grace_seconds=3600)
    rewind(schedule, db_now().replace(microsecond=0) - timedelta(seconds=30))
    assert sweep_due_schedules(batch=7) == 7
    assert Run.objects.count() == 7


@pytest.mark.parametrize(
    ("policy", "runs", "outcome"), [("run_once", 1, "queued"), ("skip", 0, "skipped_misfire")]
)
def test_down_across_ten_fires_the_misfire_policy_decides_once_for_all_of_them(policy, runs, outcome):
    # Every hour at M:S, last fired 45 s ago; the grace is 30 s, so all ten are misfires.
    expression, latest = hourly_fired_ago(45)
    schedule = make_schedule(
        make_revision(), expression, misfire=policy, misfire_grace_seconds=30, overlap="allow"
    )
    rewind(schedule, latest - timedelta(hours=9))  # the control plane was down for ten fires

    assert sweep_due_schedules() == 1

    assert Run.objects.count() == runs
    fire = ScheduleFire.objects.get()
    assert (fire.fire_at, fire.outcome, fire.fires) == (latest, outcome, 10)
    assert (fire.run_id is not None) == bool(runs)
    schedule.refresh_from_db()
    assert schedule.next_fire_at == latest + timedelta(hours=1)  # the next regular fire, in the future
    assert schedule.next_fire_at > db_now()
    assert sweep_due_schedules() == 0


@pytest.mark.parametrize("policy", ["run_once", "skip"])
def test_after_a_gap_whose_newest_fire_is_within_the_grace_that_fire_runs_once(policy):
    expression, latest = hourly_fired_ago(20)
    schedule = make_schedule(
        make_revision(), expression, misfire=policy, misfire_grace_seconds=30, overlap="allow"
    )
    rewind(schedule, latest - timedelta(hours=9))
    assert sweep_due_schedules() == 1
    fire = ScheduleFire.objects.get()
    assert (fire.fire_at, fire.outcome, fire.fires, Run.objects.count()) == (latest, "queued", 10, 1)


def test_overlap_skip_while_a_run_is_live_starts_no_second_run():
    revision = make_revision()
    live = enqueue(revision)  # e.g. started by hand, still queued
    schedule = make_schedule(revision, "* * * * *", overlap="skip")
    rewind(schedule, floor_minute(db_now()) - timedelta(minutes=1))

    assert schedule_admit(schedule_id=schedule.pk).outcome == "skipped_overlap"

    assert list(Run.objects.values_list("pk", flat=True)) == [live.pk]
    fire = ScheduleFire.objects.get()
    assert (fire.outcome, fire.run_id) == ("skipped_overlap", None)
    # Once the live run has ended, the next fire (this minute's, already due) runs again.
    run_cancel(run_id=live.pk)
    assert schedule_admit(schedule_id=schedule.pk).outcome == "queued"
    assert Run.objects.count() == 2


def test_overlap_queue_one_defers_one_fire_and_starts_it_when_the_live_run_ends():
    revision = make_revision()
    schedule = make_schedule(revision, "*/10 * * * * *", overlap="queue_one", misfire_grace_seconds=600)
    start = db_now().replace(microsecond=0) - timedelta(seconds=40)
    rewind(schedule, start.replace(second=start.second - start.second % 10))

    assert schedule_admit(schedule_id=schedule.pk).outcome == "queued"
    assert schedule_admit(schedule_id=schedule.pk).outcome == "deferred"
    assert schedule_admit(schedule_id=schedule.pk).outcome == "skipped_overlap"  # at most one waits
    assert Run.objects.count() == 1
    schedule.refresh_from_db()
    deferred_at = schedule.pending_fire_at
    assert deferred_at is not None

    run_cancel(run_id=Run.objects.get().pk)  # the live run ends
    started = schedule_admit(schedule_id=schedule.pk)
    assert (started.outcome, started.fire_at) == ("queued", deferred_at)
    fire = ScheduleFire.objects.get(fire_at=deferred_at)
    assert (fire.outcome, fire.run_id) == ("queued", started.run_id)
    schedule.refresh_from_db()
    assert schedule.pending_fire_at is None


def test_overlap_allow_starts_a_run_per_fire_even_while_one_is_live():
    revision = make_revision()
    enqueue(revision)
    schedule = make_schedule(revision, "* * * * *", overlap="allow")
    rewind(schedule, floor_minute(db_now()))
    assert schedule_admit(schedule_id=schedule.pk).outcome == "queued"
    assert Run.objects.count() == 2


def test_two_schedules_of_one_task_with_overlap_skip_start_one_run_between_them():
    revision = make_revision()
    due_now(revision, overlap="skip"), due_now(revision, overlap="skip")
    assert sweep_due_schedules() == 2
    assert Run.objects.count() == 1
    assert sorted(ScheduleFire.objects.values_list("outcome", flat=True)) == ["queued", "skipped_overlap"]


def test_jitter_delays_the_due_time_by_the_schedules_fixed_offset():
    schedule = make_schedule(make_revision(), "* * * * *", jitter_seconds=50)
    offset = schedule.due_at - schedule.next_fire_at
    assert timedelta(0) <= offset <= timedelta(seconds=50)
    rewind(schedule, floor_minute(db_now()) + timedelta(minutes=1))
    Schedule.objects.filter(pk=schedule.pk).update(due_at=db_now() + timedelta(seconds=30))
    assert sweep_due_schedules() == 0  # nominally near, but not due before its offset


def test_no_fire_outside_the_window_and_a_finished_schedule_stops():
    now = db_now()
    later = make_schedule(make_revision(), "* * * * *", start_at=now + timedelta(hours=2))
    assert later.next_fire_at >= now + timedelta(hours=2)
    ending = make_schedule(
        make_revision(), "* * * * *", end_at=floor_minute(now) + timedelta(minutes=1, seconds=30)
    )
    rewind(ending, floor_minute(now) + timedelta(minutes=1))
    Schedule.objects.filter(pk=ending.pk).update(due_at=now - timedelta(seconds=1))
    assert schedule_admit(schedule_id=ending.pk).outcome == "queued"
    ending.refresh_from_db()
    assert (ending.next_fire_at, ending.due_at) == (None, None)


def test_a_disabled_schedule_has_no_next_fire():
    schedule = make_schedule(make_revision(), "* * * * *", enabled=False)
    assert (schedule.next_fire_at, schedule.due_at) == (None, None)
    assert sweep_due_schedules() == 0


def test_fire_times_are_utc_instants_of_the_zone_wall_clock():
    schedule = make_schedule(make_revision(), "30 2 * * *", timezone="Asia/Shanghai")
    assert schedule.next_fire_at.astimezone(UTC).time().isoformat() == "18:30:00"


def test_the_run_api_and_admin_name_the_schedule_and_fire_time(client):
    schedule = make_schedule(make_revision(), "* * * * *")
    fire_at = floor_minute(db_now())
    rewind(schedule, fire_at)
    run_id = schedule_admit(schedule_id=schedule.pk).run_id
    client.force_login(get_user_model().objects.create_superuser("root", password="correct horse battery"))
    body = client.get(f"/api/v1/ops/runs/{run_id}").json()
    assert (body["scheduleId"], body["scheduleFireAt"]) == (
        str(schedule.pk),
        fire_at.isoformat().replace("+00:00", "Z"),
    )
    page = client.get(f"/admin/runs/run/{run_id}/change/").content.decode()
    assert f"/admin/schedules/schedule/{schedule.pk}/change/" in page
    manual = enqueue(make_revision())
    assert client.get(f"/api/v1/ops/runs/{manual.pk}").json()["scheduleId"] is None


def test_a_fire_decided_before_is_never_decided_again_even_if_the_schedule_returns_to_it():
    schedule = make_schedule(make_revision(), "* * * * *", overlap="allow")
    fire_at = floor_minute(db_now())
    rewind(schedule, fire_at)
    assert schedule_admit(schedule_id=schedule.pk).outcome == "queued"
    rewind(schedule, fire_at)  # e.g. an edit whose next fire is that same instant

    assert schedule_admit(schedule_id=schedule.pk) is None

    assert Run.objects.count() == ScheduleFire.objects.count() == 1
    schedule.refresh_from_db()
    assert (schedule.next_fire_at, schedule.last_outcome) == (fire_at + timedelta(minutes=1), "queued")
