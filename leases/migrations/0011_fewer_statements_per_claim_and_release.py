"""``ql_lease_claim`` and ``ql_lease_release`` run fewer statements (docs/performance.md, "Fewer
statements per call").

Each statement a PL/pgSQL function runs costs the server a snapshot, a plan-cache check, an
executor start and end and, for a write, the table's CHECK constraints prepared again; in the
claim loop those fixed costs were most of the functions' time, not the rows they touch. So the
reads that need no lock of their own are folded into one statement each, and the writes of a
claim (the lease, the attempt, the run and both events) and of a release or renewal (the lease,
the attempt and the event) into one statement with data-modifying CTEs:

* claim: the session, its active leases (capacity) and the replay check are one read after the
  worker lock; the waiting placement classes, the ones this process has not evaluated and the
  ones to probe are one statement; the writes are one. Fourteen statements for one offer become
  seven. The run lock (``FOR UPDATE SKIP LOCKED``) and the attempt read after it stay two, so the
  attempt is read with a snapshot taken once the run is locked, as before.
* release and renewal: the session and the lease lookup are one read; after the run lock
  (which may wait) the lease and the attempt are re-read in one statement; the writes are one.
  Nine statements become five.

The lock order (worker, then run), the clock read after the worker lock, every check and its
order of outcomes, and what each function writes and answers are unchanged: where a write finds
its row changed it still raises ``QL409`` and the whole call rolls back. Reversing restores the
text of leases 0009.
"""

import importlib

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
    c record;
    now_ timestamptz;
    wanted integer;
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
    lease_gen integer;
    claimed jsonb := '[]'::jsonb;
    n integer := 0;
    moved integer;
    seq bigint;
    stop boolean := false;
BEGIN
    SELECT id, name, state INTO w FROM workers_worker WHERE id = p_worker FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    now_ := clock_timestamp();  -- the database clock, read after the worker lock
    -- the session, its free capacity (active leases counted under the worker lock) and whether an
    -- offer is replayed or a token reused (the Python path answers those)
    SELECT se.generation, se.state, se.lease_expires_at,
           least(se.max_concurrent_runs, se.available_slots)
             - (SELECT count(*) FROM leases_rundispatchlease
                 WHERE session_id = p_session AND state = 'leased') AS free,
           EXISTS (SELECT 1 FROM leases_rundispatchlease
                    WHERE worker_id = p_worker AND offer_id = ANY (p_offer_ids))
             OR EXISTS (SELECT 1 FROM leases_rundispatchlease WHERE token_digest = ANY (p_digests)) AS replay
      INTO s FROM workers_workersession se WHERE se.id = p_session AND se.worker_id = p_worker;
    IF w.state = 'revoked' OR NOT FOUND OR s.state <> 'online' OR s.lease_expires_at <= now_
       OR s.generation <> p_generation OR s.replay OR s.free <= 0 THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    wanted := least(s.free, cardinality(p_offer_ids));
    -- the placement classes waiting (a loose index scan from a random point, wrapping), those
    -- this process has not evaluated, and those to probe
    WITH RECURSIVE above(sha) AS (
        SELECT min(placement_sha256) FROM runs_runattempt
         WHERE state = 'claimed' AND placement_sha256 >= p_start
      UNION ALL
        SELECT (SELECT min(placement_sha256) FROM runs_runattempt
                 WHERE state = 'claimed' AND placement_sha256 > above.sha)
          FROM above WHERE above.sha IS NOT NULL
    ), below(sha) AS (
        SELECT min(placement_sha256) FROM runs_runattempt
         WHERE state = 'claimed' AND placement_sha256 < p_start
      UNION ALL
        SELECT (SELECT min(placement_sha256) FROM runs_runattempt
                 WHERE state = 'claimed' AND placement_sha256 > below.sha AND placement_sha256 < p_start)
          FROM below WHERE below.sha IS NOT NULL
    ), top AS (
        SELECT array(SELECT sha FROM above WHERE sha IS NOT NULL LIMIT 256) AS shas
    ), waiting AS (
        -- the wrap below p_start only when fewer than 256 were found above it
        SELECT CASE WHEN cardinality(top.shas) < 256
                    THEN top.shas || array(SELECT sha FROM below WHERE sha IS NOT NULL
                                            LIMIT 256 - cardinality(top.shas))
                    ELSE top.shas END AS shas
          FROM top
    )
    SELECT cardinality(waiting.shas) AS waiting,
           array(SELECT x FROM unnest(waiting.shas) AS x WHERE NOT (x = ANY (p_known))) AS unknown,
           array(SELECT x FROM unnest(waiting.shas) AS x WHERE x = ANY (p_allowed)
                  ORDER BY random() LIMIT p_max_classes) AS probed
      INTO c FROM waiting;
    IF c.waiting = 0 THEN
        RETURN jsonb_build_object('status', 'claimed', 'offers', claimed);
    END IF;
    IF cardinality(c.unknown) > 0 THEN
        RETURN jsonb_build_object('status', 'unknown', 'classes', to_jsonb(c.unknown));
    END IF;
    IF cardinality(c.probed) = 0 THEN
        RETURN jsonb_build_object('status', 'claimed', 'offers', claimed);
    END IF;
    size := least(p_page, greatest(p_first_page, 4 * wanted));
    WHILE page < p_max_pages AND n < wanted AND NOT stop LOOP
        page := page + 1;
        seen := 0;
        FOR cand IN
            SELECT h.id, h.run_id, h.priority, h.ready_at, h.placement_sha256, h.run_version
              FROM unnest(c.probed) AS k(sha)
             CROSS JOIN LATERAL (
                SELECT at.id, at.run_id, at.priority, at.ready_at, at.placement_sha256,
                       ru.version AS run_version
                  FROM runs_runattempt at JOIN runs_run ru ON ru.id = at.run_id
                 WHERE at.state = 'claimed' AND at.placement_sha256 = k.sha
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
            lease_gen := a.lease_generation + 1;
            n := n + 1;
            spec_sha := encode(sha256(convert_to(
                replace(replace(replace(tpl, p_run_marker, r.id::text), p_attempt_marker, a.id::text),
                        p_number_marker, a.number::text), 'UTF8')), 'hex');
            -- the lease, the attempt, the run and both events: one statement
            WITH lease AS (
                INSERT INTO leases_rundispatchlease (
                    id, attempt_id, run_id, worker_id, session_id, session_generation, lease_generation,
                    offer_id, token_digest, version, state, release_reason, expires_at, spec_sha256,
                    claimed_at, completion_sha256, completion_outcome)
                VALUES (p_lease_ids[n], a.id, r.id, p_worker, p_session, s.generation, lease_gen,
                        p_offer_ids[n], p_digests[n], 0, 'leased', '', now_ + p_dispatch, spec_sha,
                        now_, '', '')
            ), attempt AS (
                UPDATE runs_runattempt
                   SET version = version + 1, lease_generation = lease_gen,
                       lease_expires_at = now_ + p_dispatch, worker_id = p_worker, session_id = p_session
                 WHERE id = a.id AND version = a.version AND state = a.state
                RETURNING 1
            ), run AS (
                UPDATE runs_run
                   SET state = 'dispatching', version = version + 1, event_sequence = event_sequence + 1,
                       placement_summary = NULL
                 WHERE id = r.id AND version = r.version
                RETURNING event_sequence
            ), events AS (
                INSERT INTO audit_event (created_at, kind, actor_type, actor, worker_id, session_id, run_id,
                                         run_sequence, attempt_id, lease_id, data)
                SELECT now(), 'run.dispatching', 'worker', left(w.name, 150), NULL::uuid, NULL::uuid, r.id,
                       run.event_sequence, NULL::uuid, NULL::uuid,
                       jsonb_build_object('lease_generation', lease_gen, 'attempt', a.number,
                                          'score', p_scores[array_position(p_allowed, cand.placement_sha256)])
                  FROM run
                UNION ALL
                SELECT now(), 'lease.claimed', 'worker', left(w.name, 150), p_worker, p_session, r.id,
                       NULL::bigint, a.id, p_lease_ids[n], jsonb_build_object('lease_generation', lease_gen)
            )
            SELECT (SELECT count(*) FROM attempt), (SELECT event_sequence FROM run) INTO moved, seq;
            IF moved <> 1 THEN
                RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
            END IF;
            IF seq IS NULL THEN
                RAISE EXCEPTION 'the run changed under this transaction' USING ERRCODE = 'QL409';
            END IF;
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
    r record;
    l record;
    now_ timestamptz;
    changed integer;
    moved integer;
BEGIN
    SELECT id, name, state INTO w FROM workers_worker WHERE id = p_worker FOR UPDATE;
    IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    now_ := clock_timestamp();  -- the database clock, read after the worker lock
    -- the session and the lease (by its unique key; its worker compared afterwards)
    SELECT se.generation, se.state, se.lease_expires_at, le.id AS lease_id, le.run_id, le.worker_id
      INTO s FROM workers_workersession se
      LEFT JOIN leases_rundispatchlease le
        ON le.attempt_id = p_attempt AND le.lease_generation = p_lease_generation
     WHERE se.id = p_session AND se.worker_id = p_worker;
    IF w.state = 'revoked' OR NOT FOUND OR s.state NOT IN ('online', 'draining')
       OR s.lease_expires_at <= now_ OR s.generation <> p_generation THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    IF s.lease_id IS NULL OR s.worker_id <> p_worker THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    SELECT id, cancel_requested_at INTO r FROM runs_run WHERE id = s.run_id FOR UPDATE;
    -- the lease and its attempt, re-read under the run lock
    SELECT to_jsonb(le) AS doc, le.id, le.worker_id, le.session_id, le.run_id, le.attempt_id,
           le.lease_generation, le.token_digest, le.session_generation, le.state, le.expires_at, le.version,
           at.state AS attempt_state, at.version AS attempt_version, at.lease_generation AS attempt_generation
      INTO l FROM leases_rundispatchlease le JOIN runs_runattempt at ON at.id = le.attempt_id
     WHERE le.id = s.lease_id;
    IF l.token_digest <> p_digest OR l.session_id <> p_session OR l.session_generation <> p_generation
       OR l.state <> 'leased' OR l.expires_at <= now_ OR l.version <> p_version THEN
        RETURN jsonb_build_object('status', 'orm');
    END IF;
    IF p_renew_by IS NULL THEN
        IF l.attempt_state <> 'claimed' OR r.cancel_requested_at IS NOT NULL
           OR l.attempt_generation <> l.lease_generation THEN
            RETURN jsonb_build_object('status', 'orm');
        END IF;
        -- the lease, the event and the attempt: one statement (the attempt and the event only
        -- once the lease has moved)
        WITH released AS (
            UPDATE leases_rundispatchlease
               SET state = 'released', release_reason = 'worker_release', ended_at = now_,
                   version = version + 1
             WHERE id = l.id AND state = 'leased' AND lease_generation = l.lease_generation
               AND version = p_version
            RETURNING id
        ), event AS (
            INSERT INTO audit_event (created_at, kind, actor_type, actor, worker_id, session_id, run_id,
                                     attempt_id, lease_id, data)
            SELECT now(), 'lease.released', 'worker', left(w.name, 150), l.worker_id, l.session_id, l.run_id,
                   l.attempt_id, l.id, jsonb_build_object(
                       'reason', 'worker_release', 'lease_generation', l.lease_generation, 'started', false)
              FROM released
        ), attempt AS (
            UPDATE runs_runattempt
               SET version = version + 1, lease_expires_at = NULL, worker_id = NULL, session_id = NULL
             WHERE id = l.attempt_id AND version = l.attempt_version AND state = l.attempt_state
               AND EXISTS (SELECT 1 FROM released)
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM released), (SELECT count(*) FROM attempt) INTO changed, moved;
        IF changed = 0 THEN RETURN jsonb_build_object('status', 'orm'); END IF;
        IF moved = 0 THEN
            RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
        END IF;
        RETURN jsonb_build_object('status', 'released', 'lease', l.doc, 'version', l.version + 1,
                                  'expires', l.expires_at, 'ended', now_, 'cancel', false);
    END IF;
    IF l.attempt_state NOT IN ('starting', 'running') THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    -- the lease and the attempt: one statement (the attempt only once the lease has moved)
    WITH renewed AS (
        UPDATE leases_rundispatchlease SET expires_at = now_ + p_renew_by, version = version + 1
         WHERE id = l.id AND state = 'leased' AND version = l.version AND expires_at = l.expires_at
        RETURNING id
    ), attempt AS (
        UPDATE runs_runattempt SET version = version + 1, lease_expires_at = now_ + p_renew_by
         WHERE id = l.attempt_id AND version = l.attempt_version AND state = l.attempt_state
           AND EXISTS (SELECT 1 FROM renewed)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM renewed), (SELECT count(*) FROM attempt) INTO changed, moved;
    IF changed = 0 THEN RETURN jsonb_build_object('status', 'orm'); END IF;
    IF moved = 0 THEN
        RAISE EXCEPTION 'the attempt changed under this transaction' USING ERRCODE = 'QL409';
    END IF;
    RETURN jsonb_build_object('status', 'renewed', 'lease', l.doc, 'version', l.version + 1,
                              'expires', now_ + p_renew_by, 'cancel', r.cancel_requested_at IS NOT NULL);
END
$fn$;
"""


def _previous(name: str) -> str:
    return importlib.import_module("leases.migrations.0009_lease_lookups_by_unique_key")._rewritten(name)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM)
        schema_editor.execute(RELEASE)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_previous("CLAIM"))
        schema_editor.execute(_previous("RELEASE"))


class Migration(migrations.Migration):
    dependencies = [("leases", "0010_completion_wakes_after_commit")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
