"""Test helpers: build workers, sessions, tasks and runs through the real services, sign
requests exactly as the agent does, and snapshot the rows a refused call must leave alone."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import ApiToken
from accounts.roles import ROLE_PERMISSIONS, sync_role_groups
from actions.enrollment import enrollment_token_create, worker_create, worker_enroll
from actions.runs import run_enqueue
from actions.sessions.registration import session_register
from actions.tasks import task_create
from actions.tokens import api_token_create
from audit.models import Event
from leases.models import RunDispatchLease
from protocol import capabilities as caps
from protocol import strictjson
from protocol.ids import uuid7
from protocol.signing import public_key_text, sign_request
from runs.models import Run, RunAttempt
from runs.revisions import RevisionSpec
from workers.models import Worker, WorkerCredential, WorkerSession

BASE_SNAPSHOT: dict[str, Any] = {
    "arch": "x86_64",
    "os": "linux",
    "executors": ["python", "shell"],
    "runtimes": [{"name": "python", "version": "3.11.7"}, {"name": "bash", "version": "5.2.15"}],
    "labels": {"zone": "eu-1"},
    "memoryMiB": 4096,
    "diskMiB": 20480,
    "cpuCount": 4,
    "gpus": [],
    "features": [],
}


def snapshot(**overrides: Any) -> caps.CapabilitySnapshot:
    return caps.snapshot({**BASE_SNAPSHOT, **overrides})


@dataclass
class Enrolled:
    """A worker with a credential and its private key, as an enrolled agent holds them."""

    worker_id: uuid.UUID
    name: str
    credential_id: str
    key: Ed25519PrivateKey


def enrolled_worker(name: str | None = None) -> Enrolled:
    name = name or f"w-{secrets.token_hex(4)}"
    worker = worker_create(name=name)
    issued = enrollment_token_create(worker_id=worker.pk)
    key = Ed25519PrivateKey.generate()
    credential = worker_enroll(token=issued.token, public_key=public_key_text(key.public_key()))
    return Enrolled(worker.pk, name, credential.pk, key)


@dataclass
class Session:
    worker: Enrolled
    session_id: uuid.UUID
    generation: int
    version: int

    def fence(self) -> dict[str, Any]:
        return {"sessionId": str(self.session_id), "generation": self.generation}


def register(
    worker: Enrolled,
    *,
    session_id: uuid.UUID | None = None,
    max_concurrent: int = 2,
    slots: int | None = None,
    snap: caps.CapabilitySnapshot | None = None,
) -> Session:
    view = session_register(
        worker_id=worker.worker_id,
        session_id=session_id or uuid7(),
        capabilities=snap or snapshot(),
        max_concurrent_runs=max_concurrent,
        available_slots=max_concurrent if slots is None else slots,
        software_version="test/1",
        protocol_version=1,
    )
    return Session(worker, view.session.pk, view.session.generation, view.session.version)


def make_revision(
    name: str | None = None,
    *,
    command: str = "true",
    executor: str = "shell",
    timeout_seconds: int = 30,
    placement: dict | None = None,
    **policy: Any,
):
    return task_create(
        name=name or f"t-{secrets.token_hex(4)}",
        spec=RevisionSpec(
            executor=executor, command=command, timeout_seconds=timeout_seconds, placement=placement, **policy
        ),
    )


def enqueue(revision, priority: int = 0):
    return run_enqueue(revision_id=revision.pk, priority=priority)


def register_body(
    capabilities: Any = BASE_SNAPSHOT, *, session_id: uuid.UUID | None = None, **changes: Any
) -> dict[str, Any]:
    """A session registration body around ``capabilities`` (sent exactly as given), for a new
    session id unless ``session_id`` is given; ``changes`` replace or add fields."""
    return {
        "sessionId": str(session_id or uuid7()),
        "capabilities": capabilities,
        "maxConcurrentRuns": 2,
        "availableSlots": 2,
        "softwareVersion": "test/1",
        "protocolVersion": 1,
        **changes,
    }


def heartbeat(session: Session, **changes: Any) -> dict[str, Any]:
    """A heartbeat body that changes nothing (``register`` leaves 2 of 2 slots free)."""
    return {**session.fence(), "expectedVersion": session.version, "availableSlots": 2, **changes}


def snapshot_rows() -> tuple:
    """Every row a refused call must leave alone."""
    return (
        list(Worker.objects.order_by("pk").values()),
        list(WorkerSession.objects.order_by("pk").values()),
        list(WorkerCredential.objects.order_by("pk").values()),
        list(RunDispatchLease.objects.order_by("pk").values()),
        list(RunAttempt.objects.order_by("pk").values()),
        list(Run.objects.order_by("pk").values()),
        list(Event.objects.order_by("pk").values_list("pk", "kind")),
    )


@dataclass
class OfferTicket:
    """What an agent keeps about one offer: its id and token, and the lease fields it was sent."""

    offer_id: uuid.UUID = field(default_factory=uuid7)
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))


class SignedClient:
    """Django's test client, signing every request with a worker key (RFC 9421 profile)."""

    def __init__(self, client, worker: Enrolled) -> None:
        self.client = client
        self.worker = worker

    def post(
        self,
        path: str,
        body: Any,
        *,
        key: Ed25519PrivateKey | None = None,
        key_id: str | None = None,
        headers: dict[str, str] | None = None,
        **sign_kwargs: Any,
    ):
        raw = body if isinstance(body, bytes) else strictjson.dumps(body)
        signed = sign_request(
            method="POST",
            path=path,
            body=raw,
            key_id=key_id or self.worker.credential_id,
            private_key=key or self.worker.key,
            **sign_kwargs,
        )
        return self.client.generic(
            "POST", path, raw, content_type="application/json", headers={**signed, **(headers or {})}
        )


# --- operators: roles and API tokens ------------------------------------------------------------


def ensure_role_groups() -> None:
    """The role groups as the migrations create them (a transactional test's flush empties them)."""
    if Group.objects.filter(name__in=ROLE_PERMISSIONS).count() != len(ROLE_PERMISSIONS):
        sync_role_groups(Group, Permission, ROLE_PERMISSIONS)


def operator_user(username: str, *, role: str | None = None, superuser: bool = False, staff: bool = True):
    """A console user: staff, in the group of ``role`` (viewer, operator, admin) if given."""
    user = get_user_model().objects.create_user(
        username, password="correct horse battery", is_staff=staff, is_superuser=superuser
    )
    if role is not None:
        ensure_role_groups()
        user.groups.add(Group.objects.get(name=role))
    return user


def api_token(user, *, role: str = "admin", check: bool = True) -> str:
    """An API token for ``user`` scoped to ``role``; ``check=False`` skips the action's rule that
    the user holds the role (to test that the user's own permissions still apply)."""
    if check:
        return api_token_create(user=user, name="test", role=role, ttl_seconds=3600).token
    return ApiToken.objects.create(user=user, expiry=timedelta(hours=1), name="test", role=role)[1]


def operator_headers(username: str = "ops", *, role: str = "admin") -> dict[str, str]:
    """``Authorization`` headers of a new user in ``role`` with a token of that role."""
    return {"Authorization": f"Token {api_token(operator_user(username, role=role), role=role)}"}


def signed_headers(worker: Enrolled, path: str, raw: bytes, **kwargs: Any) -> dict[str, str]:
    """The signature headers of a POST of ``raw`` to ``path`` (``kwargs``: see ``sign_request``)."""
    return sign_request(
        method="POST", path=path, body=raw, key_id=worker.credential_id, private_key=worker.key, **kwargs
    )


def send(client, path: str, raw: bytes, headers: dict[str, str]):
    """POST ``raw`` exactly as given, with ``headers`` (a replay sends the same headers again)."""
    return client.generic("POST", path, raw, content_type="application/json", headers=headers)


def refused(answer, status: int, code: str) -> None:
    """Assert ``answer`` is the error ``code`` with HTTP ``status``."""
    assert answer.status_code == status, answer.json()
    assert answer.json()["code"] == code, answer.json()


#: The standalone replay store (``workers.nonces``: authentication, like Redis in the cluster
#: profile) and the transaction around its insert are not repository access.
_REPLAY_TABLE = "workers_replaynonce"
_TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK")


def repository_queries(queries) -> list[str]:
    """The SQL of a ``CaptureQueriesContext`` minus the replay store's own statements."""
    return [
        q["sql"]
        for q in queries
        if _REPLAY_TABLE not in q["sql"] and not q["sql"].lstrip().upper().startswith(_TRANSACTION_CONTROL)
    ]


def index_plans(act, table: str) -> list[str]:
    """The plans (PostgreSQL, sequential scans off) of every SELECT reading ``table`` that ``act()``
    sends: the name of an index in one says that index can serve that read."""
    with CaptureQueriesContext(connection) as queries:
        act()
    reads = [
        q["sql"]
        for q in queries
        if q["sql"].lstrip().upper().startswith("SELECT") and f'"{table}"' in q["sql"]
    ]
    plans = []
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for sql in reads:
            cursor.execute("EXPLAIN " + sql)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
        cursor.execute("SET LOCAL enable_seqscan = on")
    return plans
