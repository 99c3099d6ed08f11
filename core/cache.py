"""Django's Redis cache backend, with one Redis client object per connection pool.

Django's ``RedisCacheClient.get_client`` builds a new ``redis.Redis`` for every cache call, and
redis-py's constructor registers its ~170 response callbacks each time: about 0.3 ms of CPU per
call, five or six times on every signed worker request (credential, session owner, nonce, rate
limit; docs/performance.md). A ``redis.Redis`` over a connection pool is thread-safe and
redis-py's pool resets itself in a forked child, so one client per pool is kept and reused.
Behaviour, keys and commands are Django's own.

:meth:`RedisCache.add_and_count` is the signed request's one Redis round trip: the replay nonce
(``SET NX``) and the per-worker rate-limit counter (django-ratelimit's key, ``SET NX`` then
``INCR``) in one Lua script, registered once per client (``register_script``: ``EVALSHA``).
"""

from __future__ import annotations

from typing import Any, cast

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient as DjangoRedisCacheClient

#: KEYS[1] the nonce, KEYS[2] the counter; ARGV[1], ARGV[2] their lifetimes in seconds.
#: -1: the nonce was already there (nothing counted); else the counter after this request.
_ADD_AND_COUNT = """
if not redis.call('SET', KEYS[1], 1, 'NX', 'EX', ARGV[1]) then return -1 end
if redis.call('SET', KEYS[2], 1, 'NX', 'EX', ARGV[2]) then return 1 end
return redis.call('INCR', KEYS[2])
"""


class RedisCacheClient(DjangoRedisCacheClient):
    """``RedisCacheClient`` reusing one ``redis.Redis`` per connection pool."""

    def __init__(self, servers: Any, **options: Any) -> None:
        super().__init__(servers, **options)
        self._clients: dict[int, Any] = {}
        self._scripts: dict[int, Any] = {}

    def add_and_count(self, add_key: str, add_ttl: int, count_key: str, count_ttl: int) -> int | None:
        """See :meth:`RedisCache.add_and_count` (keys already made)."""
        client = self.get_client(write=True)
        script = self._scripts.get(id(client))
        if script is None:
            script = self._scripts[id(client)] = client.register_script(_ADD_AND_COUNT)
        result = int(script(keys=[add_key, count_key], args=[add_ttl, count_ttl]))
        return None if result < 0 else result

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        index = self._get_connection_pool_index(write)  # type: ignore[attr-defined]
        client = self._clients.get(index)
        if client is None:
            pool = self._get_connection_pool(write)  # type: ignore[attr-defined]
            client = self._clients[index] = self._client(connection_pool=pool)  # type: ignore[attr-defined]
        return client


class RedisCache(DjangoRedisCache):
    """Django's ``RedisCache`` over :class:`RedisCacheClient` (``CACHES["default"]["BACKEND"]``)."""

    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = RedisCacheClient

    def add_and_count(self, add_key: str, add_ttl: int, count_key: str, count_ttl: int) -> int | None:
        """``add(add_key, 1, add_ttl)``; only if that added it, count ``count_key`` (created as 1
        with ``count_ttl``, else incremented) — atomically, in one round trip.

        Returns None when ``add_key`` already existed (nothing counted), else the new count.
        Keys are cache keys (prefixed and versioned here, as every cache call does).
        """
        client = cast(RedisCacheClient, self._cache)  # built from self._class, set above
        return client.add_and_count(
            self.make_and_validate_key(add_key), add_ttl, self.make_and_validate_key(count_key), count_ttl
        )
