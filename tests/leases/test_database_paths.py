"""The PostgreSQL functions of the activation ACKs and the completion (``ql_lease_ack``,
``ql_lease_complete``; migrations leases 0006, 0007) write what the ORM path writes, and every
case they leave to it answers exactly as the ORM path alone does (docs/leases.md, On PostgreSQL:
one round trip).

Each flow is run twice on one revision: through the functions, and with them switched off (the
ORM path of the same write paths). Per call, the columns it changed on the lease, attempt and run
rows and the events it appended are compared, ids named by role and times as offsets from the
earliest time the call wrote (both paths read the database clock once, after the locks). The
retry wait is drawn from a pinned ``random.uniform`` so that both paths draw the same.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import psycopg
import pytest
from django.db import connection

from actions.leases import activation, completion
from actions.runs import run_cancel
from audit.models import Event
from core import wakeups
from core.errors import DomainError
from leases.models import RunDispatchLease
from runs.models import Run, RunAttempt
from runs.revisions import OutputSpec
from tests.helpers import enqueue, enrolled_worker, make_revision, register
from tests.leases.flows import Held, claim_one, complete, expire_lease, running, start, starting

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the functions exist on PostgreSQL only"),
]

SECRET = "s3cr3t-token-value"


@pytest.fixture
def orm_only():
    """A switch: ``orm_only(True)`` makes the write paths skip their database functions."""
    patch = pytest.MonkeyPatch()

    def switch(on: bool) -> None:
        if on:
            patch.setattr(activation, "_ack_in_database", lambda **call: None)
            patch.setattr(completion, "_complete_in_database", lambda **call: None)
        else:
            patch.undo()

    yield switch
    patch.undo()


@pytest.fixture
def answered(monkeypatch):
    """Which database functions answered a call themselves (a non-None result), in call order."""
    calls: list[tuple[str, bool]] = []
    for module, name in ((activation, "_ack_in_database"), (completion, "_complete_in_database")):
        real = getattr(module, name)

        def spy(_real=real, _name=name, **call):
            result = _real(**call)
            calls.append((_name, result is not None))
            return result

        monkeypatch.setattr(module, name, spy)
    return calls


def _rows(held: Held) -> dict[str, dict[str, Any]]:
    return {
        "lease": RunDispatchLease.objects.filter(
            attempt_id=held.attempt_id, lease_generation=held.lease_generation
        ).values()[0],
        "attempt": RunAttempt.objects.filter(pk=held.attempt_id).values()[0],
        "run": Run.objects.filter(pk=held.run_id).values()[0],
    }


def _normal(value: Any, names: dict[Any, str], base: datetime | None) -> Any:
    if isinstance(value, uuid.UUID | str) and str(value) in names:
        return names[str(value)]
    if isinstance(value, datetime):
        assert base is not None
        return value - base
    if isinstance(value, dict):
        return {key: _normal(item, names, base) for key, item in value.items()}
    return value


def writes(held: Held, call) -> tuple[Any, dict, list]:
    """Run ``call``; return its answer (or DomainError facts), the changed columns per row and the
    appended events, normalised (see the module docstring)."""
    before = _rows(held)
    last = Event.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    try:
        answer: Any = call()
    except DomainError as error:
        answer = ("refused", error.code, error.message, error.field, error.details)
    after = _rows(held)
    changed = {
        table: {column: value for column, value in row.items() if value != before[table][column]}
        for table, row in after.items()
    }
    events = list(
        Event.objects.filter(pk__gt=last)
        .order_by("pk")
        .values("kind", "actor_type", "actor", "worker_id", "session_id", "run_id", "attempt_id", "lease_id")
    )
    sequences = list(Event.objects.filter(pk__gt=last).order_by("pk").values_list("run_sequence", "data"))
    stamps = [value for row in changed.values() for value in row.values() if isinstance(value, datetime)]
    base = min(stamps) if stamps else None
    names = {
        str(held.attempt_id): "attempt",
        str(held.run_id): "run",
        str(after["lease"]["id"]): "lease",
        str(held.session.worker.worker_id): "worker",
        str(held.session.session_id): "session",
    }
    normal = {table: _normal(row, names, base) for table, row in changed.items()}
    appended = [
        {**_normal(event, names, base), "run_sequence": sequence, "data": data}
        for event, (sequence, data) in zip(events, sequences, strict=True)
    ]
    if hasattr(answer, "lease"):  # an AckResult
        lease = answer.lease
        answer = (
            answer.status,
            answer.cancel_requested,
            lease.version,
            lease.lease_generation,
            lease.offer_id == held.ticket.offer_id,
            lease.expires_at == after["lease"]["expires_at"],
        )
    elif hasattr(answer, "outcome"):  # a CompletionResult
        answer = (
            answer.attempt_id == held.attempt_id,
            answer.lease_generation,
            answer.sequence,
            answer.outcome,
        )
    return answer, normal, appended


def _flow(session, steps) -> list:
    held = claim_one(session)
    out = []
    for step in steps:
        if isinstance(step, tuple):  # (something done first, not compared; the call)
            step[0](held)
            step = step[1]
        out.append(writes(held, lambda step=step: step(held)))
    return out


SUCCEEDED = (starting, running, lambda held: complete(held))


def _complete_with(outcome: str, exit_code: int | None, stdout: str = "ok\n"):
    return lambda held: complete(held, outcome=outcome, exit_code=exit_code, stdout=stdout)


def _cancel_then(step):
    return (lambda held: run_cancel(run_id=held.run_id), step)


SCENARIOS = {
    "succeeded": ({}, SUCCEEDED),
    "failed, retried": (
        {"max_attempts": 2, "retry_on": ("failed",)},
        (starting, running, _complete_with("failed", 3)),
    ),
    "failed, no retry left": ({"retry_on": ("failed",)}, (starting, running, _complete_with("failed", 3))),
    "timed out": ({}, (starting, running, _complete_with("timed_out", None))),
    "cancelled on request": ({}, (starting, running, _cancel_then(_complete_with("cancelled", None)))),
    "failed after a cancel request": (
        {"max_attempts": 3, "retry_on": ("failed",)},
        (starting, running, _cancel_then(_complete_with("failed", 1))),
    ),
    "cancel requested before starting": (
        {},
        (_cancel_then(starting), running, _complete_with("cancelled", -15)),
    ),
    "secret in the tails": (
        {"env": {"TOKEN": SECRET}, "output": OutputSpec(secret_env=("TOKEN",))},
        (starting, running, _complete_with("succeeded", 0, f"token={SECRET}\n")),
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_functions_write_what_the_orm_path_writes(scenario, orm_only, answered, monkeypatch):
    monkeypatch.setattr("runs.outcomes.random.uniform", lambda low, high: high)  # both paths draw alike
    policy, steps = SCENARIOS[scenario]
    revision = make_revision(**policy)
    session = register(enrolled_worker(), max_concurrent=2)
    enqueue(revision), enqueue(revision)
    through_functions = _flow(session, steps)
    assert [ok for _, ok in answered] == [True, True, True], answered  # they answered, not the ORM
    orm_only(True)
    through_orm = _flow(session, steps)
    assert len(answered) == 3  # switched off: not called again
    for step, (functions, orm) in enumerate(zip(through_functions, through_orm, strict=True)):
        assert functions == orm, f"call {step + 1} of {scenario}"
    if scenario == "secret in the tails":
        assert (
            SECRET
            not in RunAttempt.objects.filter(stdout_tail__contains="token=").values_list(
                "stdout_tail", flat=True
            )[0]
        )


def test_a_completion_this_process_knows_nothing_about_learns_and_writes_the_same(
    orm_only, answered, monkeypatch
):
    """Without the running ACK's note (another replica took it) the first call answers the
    attempt's revision and number and writes nothing; the second writes what the ORM path does."""
    monkeypatch.setattr("runs.outcomes.random.uniform", lambda low, high: high)
    revision = make_revision(max_attempts=2, retry_on=("failed",))
    session = register(enrolled_worker(), max_concurrent=2)
    enqueue(revision), enqueue(revision)
    held = start(claim_one(session))
    completion._attempts.clear()
    completion._revisions.clear()
    fail = _complete_with("failed", 2)
    through_functions = writes(held, lambda: fail(held))
    assert answered[-1] == ("_complete_in_database", True)
    orm_only(True)
    other = start(claim_one(session))
    assert writes(other, lambda: fail(other)) == through_functions


# --- what the functions leave to the ORM path -------------------------------------------------------


def _wrong(held: Held, **changes):
    return Held(
        held.session,
        held.ticket,
        changes.get("attempt_id", held.attempt_id),
        changes.get("lease_generation", held.lease_generation),
        changes.get("lease_version", held.lease_version),
        held.execution,
        held.run_id,
    )


def _token(held: Held) -> Held:
    out = _wrong(held)
    out.ticket = type(held.ticket)(offer_id=held.ticket.offer_id)
    return out


def _offer(held: Held) -> Held:
    out = _wrong(held)
    out.ticket = type(held.ticket)(token=held.ticket.token)
    return out


def _session_generation(held: Held) -> Held:
    out = _wrong(held)
    out.session = type(held.session)(
        held.session.worker, held.session.session_id, held.session.generation + 1, held.session.version
    )
    return out


def _expired(held: Held) -> Held:
    expire_lease(held.attempt_id, seconds_ago=5)
    return held


#: (name, how far the attempt got first, how the caller is out of date, the call)
REFUSALS = [
    ("token", "claimed", _token, starting),
    ("offer id", "claimed", _offer, starting),
    ("lease version", "claimed", lambda h: _wrong(h, lease_version=h.lease_version + 1), starting),
    ("lease generation", "claimed", lambda h: _wrong(h, lease_generation=h.lease_generation + 1), starting),
    ("session generation", "claimed", _session_generation, starting),
    ("expired lease", "claimed", _expired, starting),
    ("repeated starting", "starting", lambda h: h, starting),
    ("starting after running", "running", lambda h: h, starting),
    ("running before starting", "claimed", lambda h: h, running),
    ("repeated running", "running", lambda h: h, running),
    ("another handle", "running", lambda h: h, lambda h: running(h, pid=99)),
    ("running, stale token", "starting", _token, running),
    ("complete before running", "starting", lambda h: h, lambda h: complete(h)),
    ("complete, stale token", "running", _token, lambda h: complete(h)),
    ("complete, expired", "running", _expired, lambda h: complete(h)),
    ("cancelled without a request", "running", lambda h: h, _complete_with("cancelled", None)),
    ("identical resend", "completed", lambda h: h, lambda h: complete(h)),
    ("another result", "completed", lambda h: h, _complete_with("failed", 1)),
]


def _advance(held: Held, to: str) -> None:
    for state, step in (("starting", starting), ("running", running), ("completed", lambda h: complete(h))):
        step(held)
        if state == to:
            return


@pytest.mark.parametrize(("name", "at", "stale", "call"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_what_a_function_leaves_to_the_orm_path_answers_as_the_orm_path_alone(
    name, at, stale, call, orm_only, answered
):
    session = register(enrolled_worker())
    enqueue(make_revision())
    held = claim_one(session)
    if at != "claimed":
        _advance(held, at)
    caller = stale(held)
    answered.clear()
    through_functions = writes(held, lambda: call(caller))
    assert answered and not any(ok for _, ok in answered), answered  # the function left it
    orm_only(True)
    assert writes(held, lambda: call(caller)) == through_functions
    assert through_functions[1] == {"lease": {}, "attempt": {}, "run": {}} and not through_functions[2]


# --- wake-ups -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_functions_send_the_wake_ups_the_orm_path_sends(orm_only):
    """Starting and running wake nobody; a completion wakes the worker's waiting requests once,
    on commit, through either path."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    params["application_name"] = wakeups.LISTENER_APPLICATION  # as api.waiting's connection
    listener = psycopg.connect(**params, autocommit=True)
    listener.execute(f"LISTEN {wakeups.CHANNEL}")
    try:
        session = register(enrolled_worker(), max_concurrent=2)
        revision = make_revision()
        enqueue(revision), enqueue(revision)
        list(listener.notifies(timeout=0.3, stop_after=100))  # the enqueues' own
        worker = wakeups.WORKER_PREFIX + str(session.worker.worker_id)

        def heard_after(call) -> list[str]:
            call()
            return [n.payload for n in listener.notifies(timeout=0.3, stop_after=100)]

        heard = {}
        for path in ("functions", "orm"):
            orm_only(path == "orm")
            held = claim_one(session)
            list(listener.notifies(timeout=0.3, stop_after=100))
            heard[path] = [
                heard_after(lambda h=held: starting(h)),
                heard_after(lambda h=held: running(h)),
                heard_after(lambda h=held: complete(h)),
            ]
        assert heard["functions"] == heard["orm"] == [[], [], [worker]]
    finally:
        listener.close()
