"""PostgreSQL function for the completion: an attempt's result in one round trip.

``ql_lease_complete`` does the fenced write of ``actions.leases.completion.lease_complete`` on the
server, like the functions of leases 0004 and 0006: lock the worker row, read the clock *after*
the lock, pass the session fence, find the lease, lock its run, re-read the lease under that lock
and check its identity (token digest, session and generation), state and expiry and that the
attempt runs; then complete the lease, end the attempt, move the run and write the events and the
wake-up of the ORM path.

What is policy stays in Python (``runs.outcomes.run_end``, ``logs.rules.mask_text``): the caller
computes, for the attempt's pinned revision and number, the masked output tails, the payload
digest and the run's next state for both cases the function can find (element 1: no cancellation
request on the run, element 2: one), with the retry wait already drawn; the function only picks
the element by what it reads under the run lock. It checks that the revision and number the plan
was made for are the attempt's (a pinned revision never changes, nor an attempt's number); if not,
it answers ``learn`` with them and writes nothing, and the caller plans again. Every other case (a
refusal, an exact replay, an expired lease inside an outage's grace window, a ``cancelled`` report
without a request, a run in a state the transition table does not allow) answers ``orm`` before
anything is written, and the Python path answers in the same transaction (docs/leases.md,
Completion). SQLite has no such function.
"""

from django.db import migrations

COMPLETE = r"""
CREATE OR REPLACE FUNCTION ql_lease_complete(
    p_worker uuid, p_session uuid, p_generation bigint, p_attempt uuid, p_lease_generation integer,
    p_digest text, p_revision uuid, p_number integer,
    p_sequence integer, p_outcome text, p_exit_code integer, p_sha256 text, p_stdout text, p_stderr text,
    p_run_from text[], p_run_states text[], p_error_classes text[], p_waits interval[], p_run_data jsonb,
    p_channel text, p_wake text
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
-- p_run_states, p_error_classes, p_waits: [no cancellation request, cancellation requested]; a
-- NULL state leaves that case to Python; a wait (retry_wait) sets next_attempt_at = now + wait
-- instead of finished_at, exit_code and error_class. p_run_data: the JSON array of both events' data.
DECLARE
    w record;
    s record;
    l record;
    r record;
    a record;
    now_ timestamptz;
    seq bigint;
    i integer;
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
       OR l.state <> 'leased' OR l.expires_at <= now_ OR a.state <> 'running'
       OR a.lease_generation <> l.lease_generation THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    IF p_revision IS NULL OR r.revision_id <> p_revision OR a.number <> p_number THEN
        RETURN jsonb_build_object('status', 'learn', 'revision', r.revision_id, 'number', a.number);
    END IF;
    i := CASE WHEN r.cancel_requested_at IS NULL THEN 1 ELSE 2 END;
    IF p_run_states[i] IS NULL OR NOT (r.state = ANY (p_run_from)) THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    UPDATE leases_rundispatchlease
       SET state = 'completed', ended_at = now_, completion_sequence = p_sequence,
           completion_sha256 = p_sha256, completion_outcome = p_outcome, version = version + 1
     WHERE id = l.id AND state = 'leased' AND version = l.version AND expires_at = l.expires_at;
    IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    UPDATE runs_runattempt
       SET state = p_outcome, version = version + 1, finished_at = now_, outcome_reason = '',
           exit_code = p_exit_code, stdout_tail = p_stdout, stderr_tail = p_stderr
     WHERE id = a.id AND version = a.version AND state = a.state;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
    END IF;
    INSERT INTO audit_event (kind, actor_type, actor, worker_id, run_id, attempt_id, data)
    VALUES ('attempt.' || p_outcome, 'worker', left(w.name, 150), a.worker_id, r.id, a.id,
            jsonb_build_object('number', a.number));
    IF p_waits[i] IS NOT NULL THEN
        UPDATE runs_run
           SET state = p_run_states[i], version = version + 1, event_sequence = event_sequence + 1,
               next_attempt_at = now_ + p_waits[i], placement_summary = NULL
         WHERE id = r.id AND version = r.version AND state = r.state
        RETURNING event_sequence INTO seq;
    ELSE
        UPDATE runs_run
           SET state = p_run_states[i], version = version + 1, event_sequence = event_sequence + 1,
               finished_at = now_, exit_code = p_exit_code, error_class = p_error_classes[i],
               placement_summary = NULL
         WHERE id = r.id AND version = r.version AND state = r.state
        RETURNING event_sequence INTO seq;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the run changed under this transaction' USING ERRCODE = 'QL409';
    END IF;
    INSERT INTO audit_event (kind, actor_type, actor, run_id, run_sequence, data)
    VALUES ('run.' || p_run_states[i], 'worker', left(w.name, 150), r.id, seq, p_run_data -> (i - 1));
    PERFORM pg_notify(p_channel, p_wake);  -- the lease ended: wake the worker's waiting requests
    INSERT INTO audit_event (kind, actor_type, actor, worker_id, session_id, run_id, attempt_id, lease_id,
                             data)
    VALUES ('lease.completed', 'worker', left(w.name, 150), p_worker, p_session, r.id, a.id, l.id,
            jsonb_build_object('outcome', p_outcome, 'sequence', p_sequence));
    RETURN jsonb_build_object('status', 'completed');
END
$fn$;
"""

DROP = """
DROP FUNCTION IF EXISTS ql_lease_complete(uuid, uuid, bigint, uuid, integer, text, uuid, integer, integer,
    text, integer, text, text, text, text[], text[], text[], interval[], jsonb, text, text);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(COMPLETE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("leases", "0006_ack_functions")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
