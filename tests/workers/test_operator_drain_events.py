"""An operator drain/undrain of a live session leaves a session event beside the worker event."""

import pytest

from actions.workers import worker_drain, worker_undrain
from audit.models import Event
from tests.helpers import enrolled_worker, register
from workers.models import WorkerSession

pytestmark = pytest.mark.django_db


def test_operator_drain_and_undrain_record_the_session_they_changed():
    worker = enrolled_worker()
    session = register(worker)
    worker_drain(worker_id=worker.worker_id, actor="ops")
    drained = Event.objects.get(kind="session.drained")
    assert (drained.session_id, drained.actor_type, drained.data["by"]) == (
        session.session_id,
        "operator",
        "operator",
    )
    assert WorkerSession.objects.get(pk=session.session_id).state == "draining"
    worker_undrain(worker_id=worker.worker_id, actor="ops")
    assert Event.objects.get(kind="session.undrained").session_id == session.session_id
    assert WorkerSession.objects.get(pk=session.session_id).state == "online"
    assert Event.objects.filter(kind__in=["worker.drained", "worker.undrained"]).count() == 2


def test_operator_drain_without_a_live_session_writes_only_the_worker_event():
    worker = enrolled_worker()
    worker_drain(worker_id=worker.worker_id)
    assert list(Event.objects.filter(kind__endswith="drained").values_list("kind", flat=True)) == [
        "worker.drained"
    ]
