"""``manage.py serve``'s database backend: Django's PostgreSQL backend whose pooled connections
are checked without a round trip (``qinglong.pgpool``; docs/deploy.md, "Threads and database
connections"). Django hands its pool either psycopg_pool's empty-query check or none; this backend
takes none and checks each connection it takes from the pool itself, through the pool's public
``getconn``/``putconn``. Without a pool (commands, Celery, tests) it is Django's backend unchanged.
"""

from __future__ import annotations

import psycopg
from django.db.backends.postgresql import base

from qinglong.pgpool import check_idle_connection


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        """A connection from the pool that PostgreSQL has not closed: one that fails
        :func:`~qinglong.pgpool.check_idle_connection` is closed by it and handed back, so the
        pool discards it and opens another; at most the pool's size of them in a row."""
        connection = super().get_new_connection(conn_params)
        pool = self.pool
        if pool is None:
            return connection
        for _ in range(pool.max_size):
            try:
                check_idle_connection(connection)
            except psycopg.OperationalError:
                pool.putconn(connection)
                connection = pool.getconn()
            else:
                return connection
        return connection
