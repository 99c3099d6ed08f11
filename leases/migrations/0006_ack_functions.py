"""PostgreSQL function for the activation ACKs: the starting and the running ACK in one round trip.

``ql_lease_ack`` does the whole fenced write of ``actions.leases.activation.lease_starting`` and
``lease_running`` on the server, like the functions of leases 0004: lock the worker row, read the
clock *after* the lock, pass the session fence, find the lease, lock its run (order worker → run,
``workers/locks.py``), re-read the lease under that lock and check its identity (token digest,
session and generation, offer id), state, expiry and version, then move the attempt (and, for the
running ACK, the run) with the same compare-and-swaps and the same event rows as the ORM path.
It handles only the step that succeeds; anything else (a refusal, an expired lease inside an
outage's grace window, a repeated ACK, a handle to compare, a run in a state the transition table
does not allow) returns ``orm`` *before it has written anything* and the Python path answers in
the same transaction, so every answer keeps its code, message and order (docs/leases.md,
Activation ACKs). SQLite has no such function.
"""

from django.db import migrations

ACK = r"""
CREATE OR REPLACE FUNCTION ql_lease_ack(
    p_worker uuid, p_session uuid, p_generation bigint, p_attempt uuid, p_lease_generation integer,
    p_digest text, p_offer uuid, p_version integer, p_step text,
    p_run_lease interval, p_pid bigint, p_pgid bigint, p_handle text, p_run_from text[]
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
-- p_step 'starting': attempt claimed -> starting, lease expiry := now + p_run_lease.
-- p_step 'running': attempt starting -> running under (p_pid, p_pgid, p_handle), run -> running
-- (from one of p_run_from, the states runs.states.RUN_TRANSITIONS lets move to running).
DECLARE
    w record;
    s record;
    l record;
    r record;
    a record;
    now_ timestamptz;
    seq bigint;
BEGIN
    SELECT id, name, state INTO w FROM workers_worker WHERE id = p_worker FOR UPDATE;
    IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    now_ := clock_timestamp();  -- the database clock, read after the worker lock
    SELECT id, generation, state, lease_expires_at INTO s
      FROM workers_workersession WHERE id = p_session AND worker_id = p_worker;
    IF w.state = 'revoked' OR NOT FOUND OR s.state NOT IN ('online', 'draining')
       OR s.lease_expires_at <= now_ OR s.generation <> p_generation THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    SELECT id, run_id INTO l FROM leases_rundispatchlease
     WHERE worker_id = p_worker AND attempt_id = p_attempt AND lease_generation = p_lease_generation;
    IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    SELECT id, state, version, event_sequence, cancel_requested_at, revision_id INTO r
      FROM runs_run WHERE id = l.run_id FOR UPDATE;
    SELECT * INTO l FROM leases_rundispatchlease WHERE id = l.id;  -- re-read under the run lock
    SELECT id, state, version, number, lease_generation, worker_id INTO a
      FROM runs_runattempt WHERE id = l.attempt_id;
    IF l.token_digest <> p_digest OR l.session_id <> p_session OR l.session_generation <> p_generation
       OR l.offer_id <> p_offer OR l.state <> 'leased' OR l.expires_at <= now_ OR l.version <> p_version
       OR a.lease_generation <> l.lease_generation THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    IF p_step = 'starting' THEN
        IF a.state <> 'claimed' THEN RETURN jsonb_build_object('status', 'orm'); END IF;
        UPDATE leases_rundispatchlease SET starting_at = now_, expires_at = now_ + p_run_lease
         WHERE id = l.id AND state = 'leased' AND version = l.version AND expires_at = l.expires_at
        RETURNING * INTO l;
        IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
        UPDATE runs_runattempt
           SET state = 'starting', version = version + 1, lease_expires_at = now_ + p_run_lease
         WHERE id = a.id AND version = a.version AND state = a.state;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
        END IF;
        INSERT INTO audit_event (kind, actor_type, actor, worker_id, run_id, attempt_id, data)
        VALUES ('attempt.starting', 'worker', left(w.name, 150), a.worker_id, r.id, a.id,
                jsonb_build_object('number', a.number, 'lease_generation', l.lease_generation));
    ELSIF p_step = 'running' THEN
        IF a.state <> 'starting' OR NOT (r.state = ANY (p_run_from)) THEN
            RETURN jsonb_build_object('status', 'orm');
        END IF;
        UPDATE leases_rundispatchlease SET running_at = now_
         WHERE id = l.id AND state = 'leased' AND version = l.version AND expires_at = l.expires_at
        RETURNING * INTO l;
        IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
        UPDATE runs_runattempt
           SET state = 'running', version = version + 1, started_at = now_, pid = p_pid, pgid = p_pgid,
               executor_handle = p_handle
         WHERE id = a.id AND version = a.version AND state = a.state;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
        END IF;
        INSERT INTO audit_event (kind, actor_type, actor, worker_id, run_id, attempt_id, data)
        VALUES ('attempt.running', 'worker', left(w.name, 150), a.worker_id, r.id, a.id,
                jsonb_build_object('number', a.number));
        UPDATE runs_run
           SET state = 'running', version = version + 1, event_sequence = event_sequence + 1,
               started_at = now_, placement_summary = NULL
         WHERE id = r.id AND version = r.version AND state = r.state
        RETURNING event_sequence INTO seq;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the run changed under this transaction' USING ERRCODE = 'QL409';
        END IF;
        INSERT INTO audit_event (kind, actor_type, actor, run_id, run_sequence, data)
        VALUES ('run.running', 'worker', left(w.name, 150), r.id, seq,
                jsonb_build_object('attempt', a.number));
    ELSE
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    RETURN jsonb_build_object('status', p_step, 'lease', to_jsonb(l),
                              'cancel', r.cancel_requested_at IS NOT NULL,
                              'revision', r.revision_id, 'number', a.number);
END
$fn$;
"""

DROP = """
DROP FUNCTION IF EXISTS ql_lease_ack(uuid, uuid, bigint, uuid, integer, text, uuid, integer, text, interval,
    bigint, bigint, text, text[]);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACK)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("leases", "0005_hot_path_indexes"),
        ("runs", "0006_merge_20261201_1229"),
        ("audit", "0004_control_plane_beat"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
