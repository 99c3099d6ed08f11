"""The lease functions find a lease by a unique key alone (docs/leases.md, "On PostgreSQL").

``ql_lease_release``, ``ql_lease_ack`` and ``ql_lease_complete`` looked the lease up by
``worker_id, attempt_id, lease_generation``, and ``ql_lease_claim`` checked replays with
``worker_id = … AND (offer_id = ANY … OR token_digest = ANY …)``. The functions' cached generic
plans could then take the ``(worker, offer_id)`` index for its ``worker_id`` prefix and filter
every lease the worker ever held (EXPLAIN: all of them read, one kept), so a long-lived worker's
calls grew slower with its history. Now the lease is read by ``(attempt, lease_generation)`` and
its worker compared afterwards, and the replay check is two lookups, each on its own unique index
(a token digest is unique across workers). What each function answers is unchanged.

The functions are the previous migrations' text with those lookups replaced (each replacement is
asserted to apply exactly once); reversing restores the previous text.
"""

import importlib

from django.db import migrations

_PREVIOUS = {
    "CLAIM": "leases.migrations.0004_claim_release_functions",
    "RELEASE": "leases.migrations.0004_claim_release_functions",
    "ACK": "leases.migrations.0006_ack_functions",
    "COMPLETE": "leases.migrations.0007_completion_function",
}

_BY_ATTEMPT = (
    """    SELECT id, run_id INTO l FROM leases_rundispatchlease
     WHERE worker_id = p_worker AND attempt_id = p_attempt AND lease_generation = p_lease_generation;
    IF NOT FOUND THEN RETURN jsonb_build_object('status', 'orm'); END IF;""",
    """    SELECT id, run_id, worker_id INTO l FROM leases_rundispatchlease
     WHERE attempt_id = p_attempt AND lease_generation = p_lease_generation;
    IF NOT FOUND OR l.worker_id <> p_worker THEN RETURN jsonb_build_object('status', 'orm'); END IF;""",
)

_REPLAY = (
    """    PERFORM 1 FROM leases_rundispatchlease
     WHERE worker_id = p_worker AND (offer_id = ANY (p_offer_ids) OR token_digest = ANY (p_digests));""",
    """    PERFORM 1 FROM leases_rundispatchlease WHERE worker_id = p_worker AND offer_id = ANY (p_offer_ids)
    UNION ALL
    SELECT 1 FROM leases_rundispatchlease WHERE token_digest = ANY (p_digests);""",
)

_REPLACEMENTS = {"CLAIM": _REPLAY, "RELEASE": _BY_ATTEMPT, "ACK": _BY_ATTEMPT, "COMPLETE": _BY_ATTEMPT}


def _previous(name: str) -> str:
    return getattr(importlib.import_module(_PREVIOUS[name]), name)


def _rewritten(name: str) -> str:
    old, new = _REPLACEMENTS[name]
    text = _previous(name)
    if text.count(old) != 1:
        raise RuntimeError(f"leases 0009: the lookup to replace is not in {name} exactly once")
    return text.replace(old, new)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in _REPLACEMENTS:
            schema_editor.execute(_rewritten(name))


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in _REPLACEMENTS:
            schema_editor.execute(_previous(name))


class Migration(migrations.Migration):
    dependencies = [("leases", "0008_claim_loop_indexes")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
