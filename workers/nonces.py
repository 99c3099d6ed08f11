"""The standalone profile's replay memory: a table of accepted nonces (``ReplayNonce``).

The cluster profile keeps nonces in Redis (``cache.add`` = ``SET NX``, shared by all replicas).
The standalone profile keeps them in its database, so that a restarted control plane still
knows every nonce it accepted before and refuses nothing fresh (an in-memory store had to
refuse every request signed before the process started). One ``INSERT … ON CONFLICT DO
NOTHING`` per accepted signature is the check: of two requests carrying one nonce, exactly one
inserts the row. The sweep cycle deletes expired rows in bounded batches.
"""

from __future__ import annotations

import time

from django.db import connection

from workers.models import ReplayNonce

_TABLE = ReplayNonce._meta.db_table


def nonce_insert(key: str, ttl_seconds: int, *, now: float | None = None) -> bool:
    """Remember ``key`` (``<keyid>:<nonce>``, ≤ 200 chars) for ``ttl_seconds``; False if it is known.

    One statement (SQLite and PostgreSQL both have ``ON CONFLICT DO NOTHING``); it opens no
    transaction of its own: ``actions.nonces.nonce_record`` runs it as a write path.
    """
    expires_at = int((time.time() if now is None else now) + ttl_seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_TABLE} (key, expires_at) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
            [key, expires_at],
        )
        return cursor.rowcount == 1


def nonces_prune(*, batch: int, now: float | None = None) -> int:
    """Delete up to ``batch`` expired nonces; returns how many went (the sweep calls it)."""
    cutoff = int(time.time() if now is None else now)
    expired = list(ReplayNonce.objects.filter(expires_at__lt=cutoff).values_list("key", flat=True)[:batch])
    if not expired:
        return 0
    deleted, _ = ReplayNonce.objects.filter(key__in=expired, expires_at__lt=cutoff).delete()
    return deleted


def nonces_held() -> int:
    """Rows in the table (expired ones not yet pruned included): the ``/metrics`` store size."""
    return ReplayNonce.objects.count()
