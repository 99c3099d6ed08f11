"""The Redis cache backend keeps one pool and one client per server and process (core/cache.py):
under ASGI Django builds a cache object per request context, and each must not open its own
connection to Redis."""

from __future__ import annotations

import contextvars
import secrets
import threading

import pytest
from django.core.cache import caches

from core.cache import RedisCache


def _cache_of_a_new_context(settings_alias: str) -> RedisCache:
    """``caches[alias]`` as a request under ASGI sees it: from a context of its own."""
    return contextvars.Context().run(lambda: caches[settings_alias])


@pytest.mark.redis
def test_caches_of_separate_requests_share_one_redis_connection(settings, redis_url):
    prefix = f"qltest{secrets.token_hex(4)}"
    settings.CACHES = {
        **settings.CACHES,
        "shared": {"BACKEND": "core.cache.RedisCache", "LOCATION": redis_url, "KEY_PREFIX": prefix},
    }
    first, second = _cache_of_a_new_context("shared"), _cache_of_a_new_context("shared")
    assert first is not second  # what Django does: one cache object per context

    def request(cache: RedisCache, index: int) -> None:
        cache.set(f"k{index}", index, 30)
        assert cache.get(f"k{index}") == index
        assert cache.add_and_count(f"nonce{index}", 30, "counter", 30) is not None

    for index, cache in enumerate((first, second)):  # one after the other, in other threads
        thread = threading.Thread(target=request, args=(cache, index))
        thread.start()
        thread.join()
    pool = first._cache.get_client(write=True).connection_pool
    assert second._cache.get_client(write=True).connection_pool is pool
    assert len(pool._available_connections) + len(pool._in_use_connections) == 1
    first.delete_many(["k0", "k1", "counter"])


def test_another_server_gets_its_own_pool():
    one = RedisCache("redis://127.0.0.1:6379/14", {})
    other = RedisCache("redis://127.0.0.1:6379/13", {})
    again = RedisCache("redis://127.0.0.1:6379/14", {})
    pool = one._cache.get_client().connection_pool
    assert other._cache.get_client().connection_pool is not pool
    assert again._cache.get_client().connection_pool is pool
