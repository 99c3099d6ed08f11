"""A small fleet to act on, users in every role, and a fingerprint of every table."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from django.apps import apps

from actions.runs import run_cancel
from actions.workers import worker_drain
from tests.helpers import (
    Enrolled,
    Session,
    api_token,
    enqueue,
    enrolled_worker,
    make_revision,
    operator_user,
    register,
)

#: The five kinds of user the matrix walks.
ROLES = ("viewer", "operator", "admin", "staff_no_group", "superuser")

#: Tables an act never changes but a request may: the login session (and messages kept in it),
#: and the control plane's own records of its last sweep cycle and liveness beat (a live server writes them).
NOT_FINGERPRINTED = {"sessions.session", "audit.sweepmark", "audit.controlplanebeat"}


@dataclass
class World:
    worker: Enrolled  # active, enrolled, with a live session
    session: Session
    draining: Enrolled  # drained by an operator, for undrain
    task_name: str
    revision_id: object
    queued_run_id: object
    finished_run_id: object


def build_world() -> World:
    worker = enrolled_worker("matrix-live")
    session = register(worker)
    draining = enrolled_worker("matrix-draining")
    worker_drain(worker_id=draining.worker_id)
    revision = make_revision(name="matrix-task")
    queued = enqueue(revision)
    finished = enqueue(revision)
    run_cancel(run_id=finished.pk)
    return World(worker, session, draining, "matrix-task", revision.pk, queued.pk, finished.pk)


def user_in(kind: str):
    """A user of ``kind`` (one of :data:`ROLES`)."""
    if kind == "superuser":
        return operator_user(f"u-{kind}", superuser=True)
    if kind == "staff_no_group":
        return operator_user(f"u-{kind}")
    return operator_user(f"u-{kind}", role=kind)


def token_of(user, kind: str) -> str:
    """An API token for ``user``: its own role; admin for the superuser; viewer (unchecked) for a
    staff user in no group, whose own (missing) permissions must still refuse everything."""
    if kind == "superuser":
        return api_token(user, role="admin")
    if kind == "staff_no_group":
        return api_token(user, role="viewer", check=False)
    return api_token(user, role=kind)


def fingerprint() -> dict[str, str]:
    """A digest of every row of every table (but :data:`NOT_FINGERPRINTED`), by model."""
    prints = {}
    for model in apps.get_models(include_auto_created=True):
        label = model._meta.label_lower
        if label in NOT_FINGERPRINTED:
            continue
        rows = sorted(repr(sorted(row.items())) for row in model.objects.values())
        prints[label] = hashlib.sha256("\n".join(rows).encode()).hexdigest()
    return prints


def changed_tables(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(label for label in after if before.get(label) != after[label])
