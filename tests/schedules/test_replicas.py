"""Two control-plane replicas — separate processes on PostgreSQL — admit the same schedules over
five minutes of fires (moved into the past in the database): exactly one decision, and for
``allow`` exactly one run, per fire; none lost. Threads racing on one store: the same, on both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from actions.schedules import sweep_due_schedules
from core.db import db_now
from runs.models import Run
from schedules.models import Schedule, ScheduleFire
from tests.agent.processes import database_url
from tests.concurrency.threads import race
from tests.helpers import make_revision
from tests.schedules.flows import fires_between, make_schedule, rewind

pytestmark = [pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]

PLAN = [
    # (task, expression, overlap)
    ("a", "* * * * *", "allow"),
    ("a", "* * * * *", "allow"),  # two schedules of one task: both lock the task row
    ("b", "*/10 * * * * *", "allow"),
    ("c", "*/30 * * * * *", "allow"),
    ("d", "*/2 * * * *", "allow"),
    ("e", "* * * * *", "skip"),
]


def five_minutes_of_fires() -> tuple[list[Schedule], object]:
    revisions = {name: make_revision() for name in sorted({task for task, _, _ in PLAN})}
    start = db_now() - timedelta(minutes=5)
    schedules = []
    for task, expression, overlap in PLAN:
        schedule = make_schedule(revisions[task], expression, overlap=overlap, misfire_grace_seconds=3600)
        first = fires_between(schedule, start, start + timedelta(minutes=5))[0]
        schedules.append(rewind(schedule, first))
    return schedules, start


def assert_exactly_one_decision_per_fire(schedules, start):
    total = 0
    for schedule in schedules:
        schedule.refresh_from_db()
        decided = list(ScheduleFire.objects.filter(schedule=schedule).order_by("fire_at"))
        expected = fires_between(schedule, start, schedule.last_fire_at)
        assert [fire.fire_at for fire in decided] == expected, schedule.cron
        assert schedule.next_fire_at > expected[-1]
        outcomes = Counter(fire.outcome for fire in decided)
        if schedule.overlap == "allow":
            assert outcomes == {"queued": len(expected)}
        else:
            assert outcomes == {"queued": 1, "skipped_overlap": len(expected) - 1}
        total += len(decided)
    queued = ScheduleFire.objects.filter(outcome="queued")
    assert Run.objects.count() == queued.count() == len(set(queued.values_list("run_id", flat=True)))
    return total


@pytest.mark.postgres
@pytest.mark.slow
def test_two_replica_processes_admit_each_fire_exactly_once(tmp_path):
    schedules, start = five_minutes_of_fires()
    env = {**os.environ, "DATABASE_URL": database_url(), "QINGLONG_VAR_DIR": str(tmp_path)}
    env.pop("QINGLONG_TEST_LEG", None)
    go = tmp_path / "go"
    replicas = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.schedules.replica", str(tmp_path / f"ready-{i}"), str(go)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):
            assert all(p.poll() is None for p in replicas), [p.communicate() for p in replicas]
            assert time.monotonic() < deadline, "the replicas did not start"
            time.sleep(0.05)
        go.touch()
        outputs = [p.communicate(timeout=120) for p in replicas]
    finally:
        for p in replicas:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in replicas] == [0, 0], outputs
    decided = [json.loads(out.strip().splitlines()[-1])["decided"] for out, _ in outputs]

    total = assert_exactly_one_decision_per_fire(schedules, start)
    five_minutes = sum(len(fires_between(s, start, start + timedelta(minutes=5))) for s in schedules)
    assert sum(decided) == total >= five_minutes
    assert all(count > 0 for count in decided), decided  # both replicas really admitted


def test_three_sweepers_on_separate_connections_admit_each_fire_exactly_once():
    schedules, start = five_minutes_of_fires()
    results = race(*[sweep_due_schedules] * 3)
    assert all(kind == "ok" for kind, _ in results), results
    while sweep_due_schedules():  # fires that came due while they raced
        pass
    total = assert_exactly_one_decision_per_fire(schedules, start)
    assert sum(value for _, value in results) <= total
