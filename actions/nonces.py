"""Replay nonces of the standalone profile, kept in the database (``workers.nonces``)."""

from __future__ import annotations

from core.db import write_path
from workers.nonces import nonce_insert


@write_path
def nonce_record(*, key: str, ttl_seconds: int) -> bool:
    """Remember ``key`` for ``ttl_seconds`` (one insert, one transaction); False if already seen.

    Raises DomainError ``storage_busy`` (503) when SQLite stays locked through the bounded retry
    (``core.db.write_path``). docs/transport.md "Replay".
    """
    return nonce_insert(key, ttl_seconds)
