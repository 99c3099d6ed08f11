"""Builders shared by the placement tests: operator API client, workers, stored-row counts."""

from __future__ import annotations

from typing import Any

from audit.models import Event
from protocol import capabilities as caps
from runs.models import Task, TaskRevision
from tests.helpers import BASE_SNAPSHOT, Enrolled, Session, enrolled_worker, register
from workers.models import WorkerSession


class OperatorClient:
    """Django's test client with a staff token, as another system calls the operator API."""

    def __init__(self, client, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Token {token}"}

    def get(self, path: str, **params):
        return self.client.get(path, params, headers=self.headers)

    def post(self, path: str, body: bytes | str):
        return self.client.generic("POST", path, body, content_type="application/json", headers=self.headers)


def live(
    name: str | None = None, *, max_concurrent: int = 2, slots: int | None = None, **snapshot: Any
) -> tuple[Enrolled, Session]:
    """An enrolled worker with a live session whose snapshot is BASE_SNAPSHOT plus ``snapshot``."""
    worker = enrolled_worker(name)
    session = register(
        worker, max_concurrent=max_concurrent, slots=slots, snap=caps.snapshot({**BASE_SNAPSHOT, **snapshot})
    )
    return worker, session


def stored() -> tuple[int, int, int, int]:
    """Sessions, tasks, revisions and events: a refused request adds none of them."""
    return (
        WorkerSession.objects.count(),
        Task.objects.count(),
        TaskRevision.objects.count(),
        Event.objects.count(),
    )
