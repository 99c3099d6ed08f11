"""PostgreSQL functions for the hot lease write paths: claim, release and renew in one round trip.

Each function does the whole fenced write of its Python twin (``actions/leases/claims.py``,
``actions/leases/renewal.py``) on the server: lock the worker row, read the clock *after* the
lock, pass the session fence, and so on — see ``docs/performance.md``. Each handles only the
path that succeeds; whenever it meets anything else (a refusal, a replay, a lapsed lease to take
over, a fresh attempt the ranking must look at, a placement class or revision the caller has not
evaluated yet) it returns a status *before it has written anything* and the Python write path
answers from its own ORM code in the same transaction, so every refusal keeps its code, message
and order. SQLite has no such functions: ``connection.vendor`` picks the path.
"""

from django.db import migrations

CLAIM = r"""
CREATE OR REPLACE FUNCTION ql_lease_claim(
    p_worker uuid, p_session uuid, p_generation bigint,
    p_offer_ids uuid[], p_digests text[], p_lease_ids uuid[],
    p_known text[], p_allowed text[], p_scores integer[],
    p_rev_ids uuid[], p_rev_templates text[],
    p_start text, p_dispatch interval, p_hold interval,
    p_max_classes integer, p_max_pages integer, p_first_page integer, p_page integer,
    p_run_marker text, p_attempt_marker text, p_number_marker text
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    w record;
    s record;
    now_ timestamptz;
    active integer;
    free integer;
    wanted integer;
    waiting text[];
    unknown text[];
    probed text[];
    size integer;
    page integer := 0;
    seen integer;
    cur_priority integer;
    cur_ready timestamptz;
    cur_id uuid;
    cand record;
    r record;
    a record;
    tpl text;
    spec_sha text;
    score integer;
    lease_gen integer;
    claimed jsonb := '[]'::jsonb;
    n integer := 0;
    seq bigint;
    stop boolean := false;
BEGIN
    SELECT id, name, state INTO w FROM workers_worker WHERE id = p_worker FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    now_ := clock_timestamp();  -- the database clock, read after the worker lock
    SELECT id, generation, state, lease_expires_at, max_concurrent_runs, available_slots
      INTO s FROM workers_workersession WHERE id = p_session AND worker_id = p_worker;
    IF w.state = 'revoked' OR NOT FOUND OR s.state NOT IN ('online', 'draining')
       OR s.lease_expires_at <= now_ OR s.generation <> p_generation OR s.state = 'draining' THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    -- a replayed offer or a reused token: the Python path answers it
    PERFORM 1 FROM leases_rundispatchlease
     WHERE worker_id = p_worker AND (offer_id = ANY (p_offer_ids) OR token_digest = ANY (p_digests));
    IF FOUND THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    -- capacity, counted under the worker lock
    SELECT count(*) INTO active FROM leases_rundispatchlease
     WHERE session_id = p_session AND state = 'leased';
    free := least(s.max_concurrent_runs, s.available_slots) - active;
    IF free <= 0 THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    wanted := least(free, cardinality(p_offer_ids));
    -- the placement classes waiting: a loose index scan from a random point, wrapping
    WITH RECURSIVE classes(sha) AS (
        SELECT min(placement_sha256) FROM runs_runattempt
         WHERE state = 'claimed' AND placement_sha256 >= p_start
      UNION ALL
        SELECT (SELECT min(placement_sha256) FROM runs_runattempt
                 WHERE state = 'claimed' AND placement_sha256 > classes.sha)
          FROM classes WHERE classes.sha IS NOT NULL
    )
    SELECT array_agg(sha) INTO waiting FROM (SELECT sha FROM classes WHERE sha IS NOT NULL LIMIT 256) c;
    IF coalesce(cardinality(waiting), 0) < 256 AND p_start <> '' THEN
        WITH RECURSIVE classes(sha) AS (
            SELECT min(placement_sha256) FROM runs_runattempt
             WHERE state = 'claimed' AND placement_sha256 < p_start
          UNION ALL
            SELECT (SELECT min(placement_sha256) FROM runs_runattempt
                     WHERE state = 'claimed' AND placement_sha256 > classes.sha
                       AND placement_sha256 < p_start)
              FROM classes WHERE classes.sha IS NOT NULL
        )
        SELECT coalesce(waiting, '{}') || coalesce(array_agg(sha), '{}') INTO waiting
          FROM (SELECT sha FROM classes WHERE sha IS NOT NULL
                 LIMIT 256 - coalesce(cardinality(waiting), 0)) c;
    END IF;
    IF waiting IS NULL OR cardinality(waiting) = 0 THEN
        RETURN jsonb_build_object('status', 'claimed', 'offers', claimed);
    END IF;
    SELECT array_agg(x) INTO unknown FROM unnest(waiting) AS x WHERE NOT (x = ANY (p_known));
    IF unknown IS NOT NULL THEN
        RETURN jsonb_build_object('status', 'unknown', 'classes', to_jsonb(unknown));
    END IF;
    SELECT array_agg(x) INTO probed FROM (
        SELECT x FROM unnest(waiting) AS x WHERE x = ANY (p_allowed) ORDER BY random() LIMIT p_max_classes
    ) c;
    IF probed IS NULL THEN
        RETURN jsonb_build_object('status', 'claimed', 'offers', claimed);
    END IF;
    size := least(p_page, greatest(p_first_page, 4 * wanted));
    WHILE page < p_max_pages AND n < wanted AND NOT stop LOOP
        page := page + 1;
        seen := 0;
        FOR cand IN
            SELECT h.id, h.run_id, h.priority, h.ready_at, h.placement_sha256, h.run_version
              FROM unnest(probed) AS c(sha)
             CROSS JOIN LATERAL (
                SELECT at.id, at.run_id, at.priority, at.ready_at, at.placement_sha256,
                       ru.version AS run_version
                  FROM runs_runattempt at JOIN runs_run ru ON ru.id = at.run_id
                 WHERE at.state = 'claimed' AND at.placement_sha256 = c.sha
                   AND (at.lease_expires_at IS NULL OR at.lease_expires_at <= now_)
                   AND ru.cancel_requested_at IS NULL
                   AND (cur_id IS NULL OR at.priority < cur_priority
                        OR (at.priority = cur_priority AND at.ready_at > cur_ready)
                        OR (at.priority = cur_priority AND at.ready_at = cur_ready AND at.id > cur_id))
                 ORDER BY at.priority DESC, at.ready_at, at.id
                 LIMIT size
             ) h
             ORDER BY h.priority DESC, h.ready_at, h.id
             LIMIT size
        LOOP
            seen := seen + 1;
            cur_priority := cand.priority; cur_ready := cand.ready_at; cur_id := cand.id;
            EXIT WHEN n >= wanted;
            IF cand.ready_at > now_ - p_hold THEN
                -- a fresh attempt: the claim ranking (placement.ranking) decides, in Python
                IF n = 0 THEN RETURN jsonb_build_object('status', 'orm'); END IF;
                stop := true; EXIT;
            END IF;
            SELECT id, state, version, event_sequence, cancel_requested_at, revision_id, task_id INTO r
              FROM runs_run WHERE id = cand.run_id AND version = cand.run_version
               FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;  -- another claimer holds it, or it changed since the page
            SELECT id, state, version, number, lease_generation, lease_expires_at INTO a
              FROM runs_runattempt WHERE id = cand.id;
            CONTINUE WHEN a.state <> 'claimed' OR r.cancel_requested_at IS NOT NULL
                OR r.state NOT IN ('queued', 'dispatching')
                OR (a.lease_expires_at IS NOT NULL AND a.lease_expires_at > now_);
            tpl := NULL;
            FOR i IN 1 .. coalesce(cardinality(p_rev_ids), 0) LOOP
                IF p_rev_ids[i] = r.revision_id THEN tpl := p_rev_templates[i]; EXIT; END IF;
            END LOOP;
            IF a.lease_expires_at IS NOT NULL OR tpl IS NULL THEN
                -- a lapsed lease to take over, or a revision not yet templated: the Python path
                IF n = 0 THEN
                    RETURN jsonb_build_object('status', CASE WHEN tpl IS NULL AND a.lease_expires_at IS NULL
                        THEN 'revision' ELSE 'orm' END, 'revision', r.revision_id);
                END IF;
                stop := true; EXIT;
            END IF;
            score := p_scores[array_position(p_allowed, cand.placement_sha256)];
            lease_gen := a.lease_generation + 1;
            n := n + 1;
            spec_sha := encode(sha256(convert_to(
                replace(replace(replace(tpl, p_run_marker, r.id::text), p_attempt_marker, a.id::text),
                        p_number_marker, a.number::text), 'UTF8')), 'hex');
            INSERT INTO leases_rundispatchlease (
                id, attempt_id, run_id, worker_id, session_id, session_generation, lease_generation,
                offer_id, token_digest, version, state, release_reason, expires_at, spec_sha256,
                claimed_at, completion_sha256, completion_outcome)
            VALUES (p_lease_ids[n], a.id, r.id, p_worker, p_session, s.generation, lease_gen,
                    p_offer_ids[n], p_digests[n], 0, 'leased', '', now_ + p_dispatch, spec_sha,
                    now_, '', '');
            UPDATE runs_runattempt
               SET version = version + 1, lease_generation = lease_gen, lease_expires_at = now_ + p_dispatch,
                   worker_id = p_worker, session_id = p_session
             WHERE id = a.id AND version = a.version AND state = a.state;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
            END IF;
            UPDATE runs_run
               SET state = 'dispatching', version = version + 1, event_sequence = event_sequence + 1,
                   placement_summary = NULL
             WHERE id = r.id AND version = r.version
            RETURNING event_sequence INTO seq;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'the run changed under this transaction' USING ERRCODE = 'QL409';
            END IF;
            INSERT INTO audit_event (created_at, kind, actor_type, actor, run_id, run_sequence, data)
            VALUES (now(), 'run.dispatching', 'worker', left(w.name, 150), r.id, seq,
                    jsonb_build_object('lease_generation', lease_gen, 'attempt', a.number, 'score', score));
            INSERT INTO audit_event (created_at, kind, actor_type, actor, worker_id, session_id, run_id,
                                     attempt_id, lease_id, data)
            VALUES (now(), 'lease.claimed', 'worker', left(w.name, 150), p_worker, p_session, r.id, a.id,
                    p_lease_ids[n], jsonb_build_object('lease_generation', lease_gen));
            claimed := claimed || jsonb_build_object(
                'position', n - 1, 'lease', p_lease_ids[n], 'attempt', a.id, 'run', r.id, 'number', a.number,
                'task', r.task_id, 'revision', r.revision_id, 'leaseGeneration', lease_gen,
                'sessionGeneration', s.generation, 'expires', now_ + p_dispatch, 'claimed', now_,
                'spec', spec_sha);
        END LOOP;
        EXIT WHEN seen < size;
        size := p_page;
    END LOOP;
    RETURN jsonb_build_object('status', 'claimed', 'offers', claimed);
END
$fn$;
"""

RELEASE = r"""
CREATE OR REPLACE FUNCTION ql_lease_release(
    p_worker uuid, p_session uuid, p_generation bigint, p_attempt uuid, p_lease_generation integer,
    p_digest text, p_version integer, p_renew_by interval
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
-- p_renew_by NULL: release an unstarted attempt; else renew a started one by that interval.
DECLARE
    w record;
    s record;
    l record;
    r record;
    a record;
    now_ timestamptz;
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
    SELECT id, state, version, event_sequence, cancel_requested_at INTO r
      FROM runs_run WHERE id = l.run_id FOR UPDATE;
    SELECT * INTO l FROM leases_rundispatchlease WHERE id = l.id;  -- re-read under the run lock
    SELECT id, state, version, lease_generation INTO a FROM runs_runattempt WHERE id = l.attempt_id;
    IF l.token_digest <> p_digest OR l.session_id <> p_session OR l.session_generation <> p_generation
       OR l.state <> 'leased' OR l.expires_at <= now_ OR l.version <> p_version THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    IF p_renew_by IS NULL THEN
        IF a.state <> 'claimed' OR r.cancel_requested_at IS NOT NULL
           OR a.lease_generation <> l.lease_generation THEN
            RETURN jsonb_build_object('status', 'orm');
        END IF;
        UPDATE leases_rundispatchlease
           SET state = 'released', release_reason = 'worker_release', ended_at = now_, version = version + 1
         WHERE id = l.id AND state = 'leased' AND lease_generation = l.lease_generation
           AND version = p_version;
        IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
        INSERT INTO audit_event (created_at, kind, actor_type, actor, worker_id, session_id, run_id,
                                 attempt_id, lease_id, data)
        VALUES (now(), 'lease.released', 'worker', left(w.name, 150), l.worker_id, l.session_id, l.run_id,
                l.attempt_id, l.id, jsonb_build_object(
                    'reason', 'worker_release', 'lease_generation', l.lease_generation, 'started', false));
        UPDATE runs_runattempt
           SET version = version + 1, lease_expires_at = NULL, worker_id = NULL, session_id = NULL
         WHERE id = a.id AND version = a.version AND state = a.state;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
        END IF;
        RETURN jsonb_build_object('status', 'released', 'lease', to_jsonb(l), 'version', l.version + 1,
                                  'expires', l.expires_at, 'ended', now_, 'cancel', false);
    END IF;
    IF a.state NOT IN ('starting', 'running') THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    UPDATE leases_rundispatchlease SET expires_at = now_ + p_renew_by, version = version + 1
     WHERE id = l.id AND state = 'leased' AND version = l.version AND expires_at = l.expires_at;
    IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    UPDATE runs_runattempt SET version = version + 1, lease_expires_at = now_ + p_renew_by
     WHERE id = a.id AND version = a.version AND state = a.state;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
    END IF;
    RETURN jsonb_build_object('status', 'renewed', 'lease', to_jsonb(l), 'version', l.version + 1,
                              'expires', now_ + p_renew_by, 'cancel', r.cancel_requested_at IS NOT NULL);
END
$fn$;
"""

DROP = """
DROP FUNCTION IF EXISTS ql_lease_claim(uuid, uuid, bigint, uuid[], text[], uuid[], text[], text[], integer[],
    uuid[], text[], text, interval, interval, integer, integer, integer, integer, text, text, text);
DROP FUNCTION IF EXISTS ql_lease_release(uuid, uuid, bigint, uuid, integer, text, integer, interval);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM)
        schema_editor.execute(RELEASE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("leases", "0003_protect_lease_references"),
        ("runs", "0004_operator_permissions_retry_of_protect_attempts"),
        ("workers", "0005_merge_20261201_1012"),
        ("audit", "0003_merge_0002_actor_type_scheduler_0002_sweep_mark"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
