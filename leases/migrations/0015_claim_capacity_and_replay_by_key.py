"""The claim's capacity count and replay check read what they need, however long the worker's
lease history (docs/performance.md, "A claim's cost grew with its worker's history").

Both are in the one read ``ql_lease_claim`` makes after the worker lock (leases ``0011``):

* the replay check asked for the worker's leases with ``offer_id = ANY (p_offer_ids)``. A plan
  made while the lease table was nearly empty (leases ``0012`` keeps it for the connection) put
  only ``worker_id`` in the index condition of ``lease_offer_unique`` and filtered the offer ids:
  every claim read every lease its worker ever held (a worker with 20,000 ended leases: 20,000
  index entries and as many heap visits per claim, against 2 buffers). Each offer id is now
  looked up on its own, by the whole unique key (``unnest`` with a ``LATERAL`` lookup, as leases
  ``0014`` does for a page's runs), which no plan can read past;
* the capacity count read ``lease_active_session`` as an index-only scan. Such a scan never marks
  an entry whose lease has ended as dead, so until the next ``VACUUM`` every claim of a session
  visited the lease row of each lease the session had ended since (600 claims after a vacuum: 600
  heap visits per claim). It now counts a column of the lease row, which makes it a plain index
  scan: the first claim to visit an ended lease's entry marks it, and later ones skip it.

Answers are unchanged (``expires_at`` is never NULL, so the count is the same). ``CREATE OR
REPLACE FUNCTION`` resets a function's settings, so the claim's are set again. Reversing restores
leases ``0014``'s claim.
"""

import importlib

from django.db import migrations

_READ_BY_KEY = importlib.import_module("leases.migrations.0014_lease_functions_read_by_key")
_PLAN_ONCE = importlib.import_module("leases.migrations.0012_lease_functions_plan_once")

_CAPACITY_AND_REPLAY_BY_FILTER = """
             - (SELECT count(*) FROM leases_rundispatchlease
                 WHERE session_id = p_session AND state = 'leased') AS free,
           EXISTS (SELECT 1 FROM leases_rundispatchlease
                    WHERE worker_id = p_worker AND offer_id = ANY (p_offer_ids))
"""

_CAPACITY_AND_REPLAY_BY_KEY = """
             - (SELECT count(la.expires_at) FROM leases_rundispatchlease la
                 WHERE la.session_id = p_session AND la.state = 'leased') AS free,
           EXISTS (SELECT 1 FROM unnest(p_offer_ids) AS o(offer_id)
                    CROSS JOIN LATERAL (SELECT 1 FROM leases_rundispatchlease lo
                                         WHERE lo.worker_id = p_worker AND lo.offer_id = o.offer_id
                                         LIMIT 1) seen)
"""

CLAIM = _READ_BY_KEY._rewritten(
    _READ_BY_KEY.CLAIM, (_CAPACITY_AND_REPLAY_BY_FILTER, _CAPACITY_AND_REPLAY_BY_KEY)
)


def _settings(schema_editor) -> None:
    _PLAN_ONCE.plan_once(None, schema_editor)
    for name, value in _READ_BY_KEY.SETTINGS.items():
        _PLAN_ONCE._alter(schema_editor, f"SET {name} = {value}")


def by_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CLAIM)  # resets its settings: set again below
    _settings(schema_editor)


def by_filter(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_READ_BY_KEY.CLAIM)
    _settings(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("leases", "0014_lease_functions_read_by_key")]

    operations = [migrations.RunPython(by_key, by_filter, elidable=False)]
