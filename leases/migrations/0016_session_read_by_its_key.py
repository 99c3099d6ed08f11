"""The lease functions read the session by its key alone and compare its worker afterwards
(docs/performance.md, "A worker's calls grew slower with each restart").

Each function read the caller's session with ``WHERE id = p_session AND worker_id = p_worker``.
A plan made while the session table held about one session per worker (leases ``0012`` keeps it
for the connection) could take the index on ``worker_id`` and filter the id, and then every call
of a worker read each session the worker ever had before finding the live one — its newest row,
behind all the others after a restart: 1,840 buffers a call after 20,000 restarts, against 5. As
leases ``0009`` did for the lease lookups, the session is now read by its primary key alone and
its worker compared in the function, with the same outcome as before when it differs (``orm``:
the Python path answers, and refuses). Claim, release (and renewal), ACKs and completion; the
log append's function is ``logs 0005``. ``CREATE OR REPLACE FUNCTION`` resets a function's
settings, so they are set again; reversing restores the previous text.
"""

import importlib

from django.db import migrations

_PLAN_ONCE = importlib.import_module("leases.migrations.0012_lease_functions_plan_once")
_READ_BY_KEY = importlib.import_module("leases.migrations.0014_lease_functions_read_by_key")
_CAPACITY = importlib.import_module("leases.migrations.0015_claim_capacity_and_replay_by_key")
_BY_UNIQUE_KEY = importlib.import_module("leases.migrations.0009_lease_lookups_by_unique_key")
_COMPLETION = importlib.import_module("leases.migrations.0010_completion_wakes_after_commit")

#: (old, new) for the ACK, the completion and the log append, whose session read is the same text.
SESSION_BY_KEY = (
    """    SELECT id, generation, state, lease_expires_at INTO s
      FROM workers_workersession WHERE id = p_session AND worker_id = p_worker;
    IF w.state = 'revoked' OR NOT FOUND OR s.state NOT IN ('online', 'draining')""",
    """    SELECT id, generation, state, lease_expires_at, worker_id INTO s
      FROM workers_workersession WHERE id = p_session;
    IF w.state = 'revoked' OR NOT FOUND OR s.worker_id <> p_worker
       OR s.state NOT IN ('online', 'draining')""",
)

_CLAIM_SESSION_BY_KEY = [
    (
        """    SELECT se.generation, se.state, se.lease_expires_at,
           least(""",
        """    SELECT se.generation, se.state, se.lease_expires_at, se.worker_id,
           least(""",
    ),
    (
        """      INTO s FROM workers_workersession se WHERE se.id = p_session AND se.worker_id = p_worker;
    IF w.state = 'revoked' OR NOT FOUND OR s.state <> 'online'""",
        """      INTO s FROM workers_workersession se WHERE se.id = p_session;
    IF w.state = 'revoked' OR NOT FOUND OR s.worker_id <> p_worker OR s.state <> 'online'""",
    ),
]

_RELEASE_SESSION_BY_KEY = [
    (
        """    SELECT se.generation, se.state, se.lease_expires_at, le.id AS lease_id, le.run_id, le.worker_id
      INTO s FROM workers_workersession se""",
        """    SELECT se.generation, se.state, se.lease_expires_at, se.worker_id AS session_worker,
           le.id AS lease_id, le.run_id, le.worker_id
      INTO s FROM workers_workersession se""",
    ),
    (
        """     WHERE se.id = p_session AND se.worker_id = p_worker;
    IF w.state = 'revoked' OR NOT FOUND OR s.state NOT IN ('online', 'draining')""",
        """     WHERE se.id = p_session;
    IF w.state = 'revoked' OR NOT FOUND OR s.session_worker <> p_worker
       OR s.state NOT IN ('online', 'draining')""",
    ),
]


def rewritten(text: str, changes) -> str:
    """``text`` with each (old, new) of ``changes`` replaced; each old must stand in it once."""
    for old, new in changes:
        if text.count(old) != 1:
            raise RuntimeError("a session read this migration rewrites is not in the function exactly once")
        text = text.replace(old, new)
    return text


#: The functions as the previous migrations left them.
PREVIOUS = {
    "CLAIM": _CAPACITY.CLAIM,
    "RELEASE": _READ_BY_KEY.RELEASE,
    "ACK": _BY_UNIQUE_KEY._rewritten("ACK"),
    "COMPLETE": _COMPLETION._rewritten(),
}
CURRENT = {
    "CLAIM": rewritten(PREVIOUS["CLAIM"], _CLAIM_SESSION_BY_KEY),
    "RELEASE": rewritten(PREVIOUS["RELEASE"], _RELEASE_SESSION_BY_KEY),
    "ACK": rewritten(PREVIOUS["ACK"], [SESSION_BY_KEY] * PREVIOUS["ACK"].count(SESSION_BY_KEY[0])),
    "COMPLETE": rewritten(PREVIOUS["COMPLETE"], [SESSION_BY_KEY]),
}


def _create(schema_editor, texts: dict[str, str]) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for text in texts.values():
            schema_editor.execute(text)  # resets the function's settings: set again below
    _PLAN_ONCE.plan_once(None, schema_editor)
    for name, value in _READ_BY_KEY.SETTINGS.items():
        _PLAN_ONCE._alter(schema_editor, f"SET {name} = {value}")


def by_key(apps, schema_editor):
    _create(schema_editor, CURRENT)


def by_key_and_worker(apps, schema_editor):
    _create(schema_editor, PREVIOUS)


class Migration(migrations.Migration):
    dependencies = [("leases", "0015_claim_capacity_and_replay_by_key")]

    operations = [migrations.RunPython(by_key, by_key_and_worker, elidable=False)]
