"""The check ``manage.py serve``'s connection pool runs before it hands out a connection.

psycopg_pool's own check (Django's, with ``CONN_HEALTH_CHECKS``) sends an empty query: one round
trip on every request. This one sends nothing (issue 13, docs/performance.md). A pooled
connection is idle — autocommit, no transaction, never a ``LISTEN`` (waiting claims hold their own
connection, ``api.waiting``) — so the server has nothing to say to it unless it is closing it: a
restart, a failover or ``pg_terminate_backend`` leave a final error message and the end of the
stream on the socket. A readable socket therefore means a connection to drop; the pool drops it
and hands out another, or opens a new one, so a restart of PostgreSQL stays invisible to the
requests that come after it. A connection whose network path died silently is not caught here
(nor, in time, by the empty query): its request fails with ``database_unavailable`` (503) and the
connection is discarded as broken when it returns to the pool.
"""

from __future__ import annotations

import select

import psycopg


def check_idle_connection(conn: psycopg.Connection) -> None:
    """Raise ``psycopg.OperationalError`` if ``conn`` is closed, broken or has unread input (the
    server is closing it: the connection is closed first, so the pool discards it and opens
    another); return without any I/O beyond a zero-timeout ``poll`` otherwise."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the pooled connection is closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):
        conn.close()  # so that the pool discards it (an open one would come back to the pool)
        raise psycopg.OperationalError("the server closed the pooled connection")
