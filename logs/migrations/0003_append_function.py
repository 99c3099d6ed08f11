"""PostgreSQL function for the live log append: both fences, the locks and the write in one round trip.

``ql_log_append`` does on the server what ``actions.logs._append_orm`` does through the ORM up to
the plan (``logs.appending.plan_append``, which stays in Python): read the worker row (no lock),
read the clock after it, pass the session fence, find the lease, lock the run row, re-read the
lease under it and check its identity (token digest, session, generation), state and expiry, the
attempt ``running``, then lock the attempt log row. Whenever a fence does not pass plainly (any
refusal, a lapse an outage may excuse) it returns ``orm`` *before it has written anything* and the
Python path answers with its codes in the same transaction.

Then, if the caller sent a plan (segment rows and the log's next state) computed from a state it
expects (``p_expect``) and the log is in that state, it applies the rate window on the database
clock (the rule of ``plan_append``) and writes: one insert of the segment rows, one update (or the
insert) of the log row. Otherwise — no plan, another state, or over the rate — it writes nothing
and answers the state (with the stored digest of ``p_seq`` when it is below the log's next
sequence number, and the revision's secret values when asked): Python plans from it and calls
again under the locks already held. The commit does not wait for the WAL flush
(``synchronous_commit`` off for this transaction, as ``actions.logs._commit_without_flush_wait``).
SQLite has no such function: ``connection.vendor`` picks the path.

The segment bytes are TOAST-compressed with lz4 where the server has it (PostgreSQL 14+ built
with lz4; else the default pglz stays): on job-like output it halves the backend's CPU per
append against pglz (measured: about 1.1 -> 0.55 ms for a 32 KiB chunk) for about 20 % more
stored bytes (1.9x instead of 2.25x compression) — the rows are transient, compaction writes the
log as one object when the attempt ends (docs/performance.md, Live logs).
"""

from django.db import migrations

APPEND = r"""
CREATE OR REPLACE FUNCTION ql_log_append(
    p_worker uuid, p_session uuid, p_generation bigint, p_attempt uuid, p_lease_generation integer,
    p_digest text, p_seq integer, p_secrets boolean, p_expect jsonb, p_state jsonb, p_count bigint,
    p_rate double precision, p_window double precision, p_sha text,
    p_streams text[], p_offsets bigint[], p_positions bigint[], p_data bytea[]
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    w record;
    s record;
    l record;
    a record;
    lg record;
    has_log boolean;
    now_ timestamptz;
    current jsonb;
    w_start timestamptz;
    w_bytes bigint;
    answer jsonb;
    rev record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT id, state INTO w FROM workers_worker WHERE id = p_worker;
    IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    now_ := clock_timestamp();  -- the database clock, read after the worker row
    SELECT id, generation, state, lease_expires_at INTO s
      FROM workers_workersession WHERE id = p_session AND worker_id = p_worker;
    IF w.state = 'revoked' OR NOT FOUND OR s.state NOT IN ('online', 'draining')
       OR s.lease_expires_at <= now_ OR s.generation <> p_generation THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    SELECT id, run_id INTO l FROM leases_rundispatchlease
     WHERE worker_id = p_worker AND attempt_id = p_attempt AND lease_generation = p_lease_generation;
    IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    PERFORM 1 FROM runs_run WHERE id = l.run_id FOR UPDATE;
    SELECT id, run_id, token_digest, session_id, session_generation, state, expires_at INTO l
      FROM leases_rundispatchlease WHERE id = l.id;  -- re-read under the run lock
    IF l.token_digest <> p_digest OR l.session_id <> p_session OR l.session_generation <> p_generation
       OR l.state <> 'leased' OR l.expires_at <= now_ THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    SELECT state INTO a FROM runs_runattempt WHERE id = p_attempt;
    IF a.state <> 'running' THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    SELECT next_seq, stored_bytes, stream_ends, stream_newline, stream_tails, truncated,
           window_started_at, window_bytes INTO lg
      FROM logs_attemptlog WHERE attempt_id = p_attempt FOR UPDATE;
    has_log := FOUND;
    current := jsonb_build_object(
        'nextSeq', coalesce(lg.next_seq, 1), 'storedBytes', coalesce(lg.stored_bytes, 0),
        'ends', coalesce(lg.stream_ends, '{}'), 'newline', coalesce(lg.stream_newline, '{}'),
        'tails', coalesce(lg.stream_tails, '{}'), 'truncated', coalesce(lg.truncated, false));
    w_start := lg.window_started_at;
    w_bytes := coalesce(lg.window_bytes, 0);
    IF p_expect IS NOT NULL AND p_expect = current AND p_count IS NOT NULL THEN
        -- the rate window (logs.appending.plan_append), on the database clock
        IF w_start IS NULL OR now_ - w_start >= make_interval(secs => p_window) THEN
            w_start := now_;
            w_bytes := 0;
        END IF;
        IF w_bytes > 0 AND w_bytes + p_count > p_rate THEN
            p_expect := NULL;  -- over the rate: Python refuses it from the state
        ELSE
            w_bytes := w_bytes + p_count;
        END IF;
    END IF;
    IF p_expect IS NULL OR p_expect <> current THEN
        answer := jsonb_build_object(
            'status', 'state', 'now', now_,
            'state', current || jsonb_build_object(
                'windowStartedAt', lg.window_started_at, 'windowBytes', coalesce(lg.window_bytes, 0)));
        IF p_seq < coalesce(lg.next_seq, 1) THEN
            answer := answer || jsonb_build_object('previous', (
                SELECT sent_sha256 FROM logs_logchunk
                 WHERE attempt_id = p_attempt AND seq = p_seq AND part = 0));
        END IF;
        IF p_secrets THEN
            SELECT rv.env, rv.secret_env INTO rev
              FROM runs_run ru JOIN runs_taskrevision rv ON rv.id = ru.revision_id WHERE ru.id = l.run_id;
            answer := answer || jsonb_build_object(
                'env', (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}') FROM jsonb_each(rev.env) e
                         WHERE rev.secret_env ? e.key),
                'secretEnv', rev.secret_env);
        END IF;
        RETURN answer;
    END IF;
    IF p_data IS NOT NULL THEN
        INSERT INTO logs_logchunk (attempt_id, seq, part, stream, "offset", position, size, data,
                                   sent_sha256, created_at)
        SELECT p_attempt, p_seq, t.part - 1, t.stream, t.off, t.pos, octet_length(t.data), t.data,
               CASE WHEN t.part = 1 THEN p_sha ELSE '' END, now_
          FROM unnest(p_streams, p_offsets, p_positions, p_data)
               WITH ORDINALITY AS t(stream, off, pos, data, part);
    END IF;
    IF has_log THEN
        UPDATE logs_attemptlog
           SET next_seq = (p_state->>'nextSeq')::integer,
               stored_bytes = (p_state->>'storedBytes')::bigint,
               stream_ends = p_state->'ends', stream_newline = p_state->'newline',
               stream_tails = p_state->'tails', truncated = (p_state->>'truncated')::boolean,
               window_started_at = w_start, window_bytes = w_bytes
         WHERE attempt_id = p_attempt;
    ELSE
        INSERT INTO logs_attemptlog (attempt_id, run_id, next_seq, stored_bytes, stream_ends, stream_newline,
                                     stream_tails, truncated, window_started_at, window_bytes, object_name,
                                     index, created_at)
        VALUES (p_attempt, l.run_id, (p_state->>'nextSeq')::integer, (p_state->>'storedBytes')::bigint,
                p_state->'ends', p_state->'newline', p_state->'tails', (p_state->>'truncated')::boolean,
                w_start, w_bytes, '', '[]'::jsonb, now_);
    END IF;
    RETURN jsonb_build_object('status', 'stored', 'windowStartedAt', w_start, 'windowBytes', w_bytes);
END
$fn$;
"""

DROP = """
DROP FUNCTION IF EXISTS ql_log_append(uuid, uuid, bigint, uuid, integer, text, integer, boolean, jsonb, jsonb,
    bigint, double precision, double precision, text, text[], bigint[], bigint[], bytea[]);
"""


LZ4 = """
DO $$
BEGIN
    EXECUTE 'ALTER TABLE logs_logchunk ALTER COLUMN data SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    NULL;  -- no lz4 in this server: pglz stays
END
$$;
"""

PGLZ = """
DO $$
BEGIN
    EXECUTE 'ALTER TABLE logs_logchunk ALTER COLUMN data SET COMPRESSION default';
EXCEPTION WHEN syntax_error THEN
    NULL;
END
$$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(APPEND)
        schema_editor.execute(LZ4)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)
        schema_editor.execute(PGLZ)


class Migration(migrations.Migration):
    dependencies = [
        ("logs", "0002_attemptlog_stream_tails"),
        ("leases", "0005_hot_path_indexes"),
        ("runs", "0006_merge_20261201_1229"),
        ("workers", "0005_merge_20261201_1012"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
