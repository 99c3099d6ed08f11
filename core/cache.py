"""Django's Redis cache backend, with one connection pool and one Redis client object per server
and process.

Django's ``RedisCacheClient.get_client`` builds a new ``redis.Redis`` for every cache call, and
redis-py's constructor registers its ~170 response callbacks each time: about 0.3 ms of CPU per
call, five or six times on every signed worker request (credential, session owner, nonce, rate
limit; docs/performance.md). And Django keeps its cache objects per request context
(``caches`` is an ``asgiref`` ``Local``): under ASGI every request builds a new cache object,
whose own pool then opens a new TCP connection to Redis (connect, ``HELLO``, health check) and
leaves it to the garbage collector. So the pools and their clients are kept per process, keyed
by server URL and pool options, and every cache object of the process uses them. A
``redis.Redis`` over a connection pool is thread-safe and redis-py's pool resets itself in a
forked child. Behaviour, keys and commands are Django's own.

:meth:`RedisCache.add_and_count` is the signed request's one Redis round trip: the replay nonce
(``SET NX``) and the per-worker rate-limit counter (django-ratelimit's key, ``SET NX`` then
``INCR``) in one Lua script, registered once per client (``register_script``: ``EVALSHA``); the
script also reads one more key when asked (the credential's version, ``workers.principals``).
"""

from __future__ import annotations

import threading
from typing import Any, cast

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient as DjangoRedisCacheClient

#: KEYS[1] the nonce, KEYS[2] the counter, KEYS[3] (optional) a key to read; ARGV[1], ARGV[2]
#: the first two's lifetimes in seconds. Answers {count, value of KEYS[3] or nil}; count -1: the
#: nonce was already there (nothing counted), else the counter after this request.
_ADD_AND_COUNT = """
local read = false
if KEYS[3] then read = redis.call('GET', KEYS[3]) end
if not redis.call('SET', KEYS[1], 1, 'NX', 'EX', ARGV[1]) then return {-1, read} end
if redis.call('SET', KEYS[2], 1, 'NX', 'EX', ARGV[2]) then return {1, read} end
return {redis.call('INCR', KEYS[2]), read}
"""


class _Shared:
    """One server's connection pool, its ``redis.Redis`` and the registered Lua script."""

    def __init__(self, pool: Any, client: Any) -> None:
        self.pool, self.client = pool, client
        self.script = client.register_script(_ADD_AND_COUNT)


#: {(pool class, server URL, pool options): _Shared} of this process.
_SHARED: dict[tuple[Any, str, str], _Shared] = {}
_SHARED_LOCK = threading.Lock()


class RedisCacheClient(DjangoRedisCacheClient):
    """``RedisCacheClient`` whose pools and ``redis.Redis`` objects are shared by the process."""

    def add_and_count(
        self, add_key: str, add_ttl: int, count_key: str, count_ttl: int, read_key: str | None = None
    ) -> tuple[int | None, Any]:
        """See :meth:`RedisCache.add_and_count` (keys already made): (count or None, value read)."""
        script = self._shared(write=True).script
        keys = [add_key, count_key] if read_key is None else [add_key, count_key, read_key]
        count, read = script(keys=keys, args=[add_ttl, count_ttl])
        loads = self._serializer.loads  # type: ignore[attr-defined]
        return (None if int(count) < 0 else int(count)), (None if read is None else loads(read))

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        return self._shared(write).client

    def _get_connection_pool(self, write: bool) -> Any:
        return self._shared(write).pool

    def _shared(self, write: bool) -> _Shared:
        server = self._servers[self._get_connection_pool_index(write)]  # type: ignore[attr-defined]
        options = self._pool_options  # type: ignore[attr-defined]
        key = (self._pool_class, server, repr(sorted(options.items())))  # type: ignore[attr-defined]
        shared = _SHARED.get(key)
        if shared is None:
            with _SHARED_LOCK:
                shared = _SHARED.get(key)
                if shared is None:
                    pool = self._pool_class.from_url(server, **options)  # type: ignore[attr-defined]
                    shared = _SHARED[key] = _Shared(pool, self._client(connection_pool=pool))  # type: ignore[attr-defined]
        return shared


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
        return self.add_count_and_read(add_key, add_ttl, count_key, count_ttl)[0]

    def add_count_and_read(
        self, add_key: str, add_ttl: int, count_key: str, count_ttl: int, read_key: str | None = None
    ) -> tuple[int | None, Any]:
        """:meth:`add_and_count`, and in the same round trip ``get(read_key)`` as it was just
        before (None when absent or not asked): (count or None, value)."""
        client = cast(RedisCacheClient, self._cache)  # built from self._class, set above
        return client.add_and_count(
            self.make_and_validate_key(add_key),
            add_ttl,
            self.make_and_validate_key(count_key),
            count_ttl,
            None if read_key is None else self.make_and_validate_key(read_key),
        )
