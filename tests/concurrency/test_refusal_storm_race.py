"""A storm of refused registrations racing on separate connections (issue 11): however they
interleave, the refusals of one worker in one window are one audit row counting all of them,
and a concurrent retry of the same operator act (retrying one finished run twice at once) makes
two new runs, each linked, never a lost or doubled audit row."""

from __future__ import annotations

import pytest

from actions.runs import run_cancel, run_retry
from actions.sessions.registration import session_register
from audit.models import Event
from core.errors import DomainError
from protocol.ids import uuid7
from runs.models import Run
from tests.concurrency.threads import race
from tests.helpers import enqueue, enrolled_worker, make_revision, snapshot

pytestmark = pytest.mark.django_db(transaction=True)

CONTENDERS = 6


def test_racing_outdated_registrations_are_counted_in_one_row(protocol_settings):
    protocol_settings(MIN_AGENT_VERSION="9.0.0")
    worker = enrolled_worker()

    def register():
        return session_register(
            worker_id=worker.worker_id,
            session_id=uuid7(),
            capabilities=snapshot(),
            max_concurrent_runs=1,
            available_slots=1,
            software_version="qinglong-worker/0.1.0",
            protocol_version=1,
        )

    results = race(*[register] * CONTENDERS)

    assert all(kind == "error" and isinstance(exc, DomainError) for kind, exc in results), results
    assert {exc.code for _, exc in results} == {"agent_version_unsupported"}
    rows = Event.objects.filter(worker_id=worker.worker_id, kind="session.version_refused")
    assert rows.count() == 1 and rows.get().data["count"] == CONTENDERS


def test_two_retries_of_one_finished_run_at_once_make_two_linked_runs():
    run = enqueue(make_revision())
    run_cancel(run_id=run.pk)

    results = race(lambda: run_retry(run_id=run.pk, actor="a"), lambda: run_retry(run_id=run.pk, actor="b"))

    assert [kind for kind, _ in results] == ["ok", "ok"], results
    assert Run.objects.filter(retry_of=run).count() == 2
    assert Event.objects.filter(kind="run.retried", run_id=run.pk).count() == 2
