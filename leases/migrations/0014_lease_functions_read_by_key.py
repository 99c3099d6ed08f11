"""The lease functions read by key whatever the statistics said when they were planned
(docs/performance.md, "Plans made on a short queue").

Their statements are planned once per connection (leases ``0012``), from the statistics of that
moment, and kept until the next ``ANALYZE`` of a table they read. A connection that planned the
claim while the queue held a few runs kept two plans that were the cheapest for a few rows and
read the whole backlog once it had grown (20,000 queued runs: 20,372 and 19,620 buffers a claim,
against 66 and 53 planned on the grown queue):

* the waiting placement classes' loose index scan took ``min(placement_sha256)`` as an aggregate
  over every waiting attempt above the start point, instead of the first index entry. Each step
  is now written as what it means, the first entry in index order
  (``ORDER BY placement_sha256 LIMIT 1``), which no plan can read past;
* a page's attempts were joined to their runs by reading every run once into a ``Materialize``
  node and filtering the join (with that node ruled out: by scanning the runs without a
  cancellation request for each attempt). The page now looks each attempt's run up by its key
  (a ``LATERAL`` subquery with ``LIMIT 1``, which the planner cannot turn into a join), and the
  functions also carry ``enable_material``, ``enable_hashjoin`` and ``enable_mergejoin`` off,
  since every join in them is a lookup by key. (``enable_sort = off`` is not among them: with it
  a claim → release loop on a 100k backlog took 372 ms instead of 1.9.)

The functions also carry ``jit = off``. PostgreSQL compiles a statement whose plan's estimated
cost passes ``jit_above_cost`` (100,000) to machine code on every execution (8 ms for the
claim's page here); the page with its run looked up by key is estimated above that on a 100k
backlog (the estimate of a ``LIMIT`` inside a ``LATERAL`` subquery is coarse), and ``0011``'s
page, estimated at 57,000 on 100k, would pass it on a backlog not twice as long. These statements
read a few rows each: compiling never pays.
With it off, 16 claimers on a 100k backlog claim as fast as on ``0013``'s function (a mean of 777
claims/s against 773 over six alternated windows), with it on five times slower (140 against 696).

The release re-reads its attempt by key the same way, and answers the attempt's placement class
itself (``placement``): the release's statement read it with a sub-select of its own, a prepared
statement outside these settings whose generic plan, made on a nearly empty attempt table,
scanned the whole table on every release once it had grown (seen in a review of ``0012``).

``CREATE OR REPLACE FUNCTION`` resets a function's settings, so the claim's and the release's are
set again with the others. Answers are unchanged but for the release's added ``placement``.
Reversing restores ``0011``'s claim and release functions and ``0012``'s settings; the code of
this migration's release (``actions.leases.renewal``) needs the ``placement`` it answers.
"""

import importlib

from django.db import migrations

_FEWER = importlib.import_module("leases.migrations.0011_fewer_statements_per_claim_and_release")
_PLAN_ONCE = importlib.import_module("leases.migrations.0012_lease_functions_plan_once")

#: The settings this migration adds to each of ``0012``'s functions.
SETTINGS = {"enable_material": "off", "enable_hashjoin": "off", "enable_mergejoin": "off", "jit": "off"}

_LOOSE_SCAN_BY_MIN = """
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
    ), top AS ("""

_LOOSE_SCAN_BY_FIRST_ENTRY = """
    WITH RECURSIVE above(sha) AS (
        SELECT (SELECT placement_sha256 FROM runs_runattempt
                 WHERE state = 'claimed' AND placement_sha256 >= p_start
                 ORDER BY placement_sha256 LIMIT 1)
      UNION ALL
        SELECT (SELECT placement_sha256 FROM runs_runattempt
                 WHERE state = 'claimed' AND placement_sha256 > above.sha
                 ORDER BY placement_sha256 LIMIT 1)
          FROM above WHERE above.sha IS NOT NULL
    ), below(sha) AS (
        SELECT (SELECT placement_sha256 FROM runs_runattempt
                 WHERE state = 'claimed' AND placement_sha256 < p_start
                 ORDER BY placement_sha256 LIMIT 1)
      UNION ALL
        SELECT (SELECT placement_sha256 FROM runs_runattempt
                 WHERE state = 'claimed' AND placement_sha256 > below.sha AND placement_sha256 < p_start
                 ORDER BY placement_sha256 LIMIT 1)
          FROM below WHERE below.sha IS NOT NULL
    ), top AS ("""

_PAGE_JOINED = """
                  FROM runs_runattempt at JOIN runs_run ru ON ru.id = at.run_id
"""

_PAGE_RUN_BY_KEY = """
                  FROM runs_runattempt at
                 CROSS JOIN LATERAL (SELECT rk.version, rk.cancel_requested_at FROM runs_run rk
                                      WHERE rk.id = at.run_id LIMIT 1) ru
"""


def _rewritten(text: str, *changes: tuple[str, str]) -> str:
    """``text`` with each (old, new) of ``changes`` replaced; each old must stand in it once."""
    for old, new in changes:
        if text.count(old) != 1:
            raise RuntimeError("leases 0011's function is not the text this migration rewrites")
        text = text.replace(old, new)
    return text


CLAIM = _rewritten(
    _FEWER.CLAIM, (_LOOSE_SCAN_BY_MIN, _LOOSE_SCAN_BY_FIRST_ENTRY), (_PAGE_JOINED, _PAGE_RUN_BY_KEY)
)

_REREAD_JOINED = """
           at.state AS attempt_state, at.version AS attempt_version, at.lease_generation AS attempt_generation
      INTO l FROM leases_rundispatchlease le JOIN runs_runattempt at ON at.id = le.attempt_id
     WHERE le.id = s.lease_id;
"""

_REREAD_ATTEMPT_BY_KEY = """
           at.state AS attempt_state, at.version AS attempt_version,
           at.lease_generation AS attempt_generation, at.placement_sha256 AS attempt_placement
      INTO l FROM leases_rundispatchlease le
     CROSS JOIN LATERAL (SELECT ak.state, ak.version, ak.lease_generation, ak.placement_sha256
                           FROM runs_runattempt ak WHERE ak.id = le.attempt_id LIMIT 1) at
     WHERE le.id = s.lease_id;
"""

_RELEASED_ANSWER = """
        RETURN jsonb_build_object('status', 'released', 'lease', l.doc, 'version', l.version + 1,
                                  'expires', l.expires_at, 'ended', now_, 'cancel', false);
"""

_RELEASED_ANSWER_WITH_CLASS = """
        RETURN jsonb_build_object('status', 'released', 'lease', l.doc, 'version', l.version + 1,
                                  'expires', l.expires_at, 'ended', now_, 'cancel', false,
                                  'placement', l.attempt_placement);
"""

RELEASE = _rewritten(
    _FEWER.RELEASE,
    (_REREAD_JOINED, _REREAD_ATTEMPT_BY_KEY),
    (_RELEASED_ANSWER, _RELEASED_ANSWER_WITH_CLASS),
)


def read_by_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM)  # resets their settings: set again below
        schema_editor.execute(RELEASE)
    _PLAN_ONCE.plan_once(apps, schema_editor)
    for name, value in SETTINGS.items():
        _PLAN_ONCE._alter(schema_editor, f"SET {name} = {value}")


def read_as_planned(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_FEWER.CLAIM)
        schema_editor.execute(_FEWER.RELEASE)
    for name in SETTINGS:
        _PLAN_ONCE._alter(schema_editor, f"RESET {name}")
    _PLAN_ONCE.plan_once(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("leases", "0013_state_checks_as_one_constant")]

    operations = [migrations.RunPython(read_by_key, read_as_planned, elidable=False)]
