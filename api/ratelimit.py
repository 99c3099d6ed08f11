"""Rate limits of the worker transport (ADR-0012 §1), on django-ratelimit and the default cache.

The cache is Redis in the cluster profile, so every replica counts into the same windows; the
standalone profile's single process counts in its own memory. Three limits exist:

* ``RATE_WORKER`` per authenticated worker, on every worker endpoint (``WorkerAPIView``);
* ``RATE_ENROLL`` per client address, on enrollment (which has no principal yet);
* ``RATE_AUTH_FAILURES`` per client address, counting only failed worker authentications, so
  forged or replayed traffic is cut off without a forger being able to lock a worker out.

A tripped limit raises DomainError ``rate_limited`` (429) with ``Retry-After`` = the seconds
left in the window.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from django.conf import settings
from django_ratelimit import ALL
from django_ratelimit.core import EXPIRATION_FUDGE, _get_window, _make_cache_key, _split_rate, get_usage

from core.errors import DomainError


def client_address(request) -> str:
    """The caller's address as a rate-limit key: ``RATELIMIT_IP_META_KEY`` (default
    ``REMOTE_ADDR``), IPv6 reduced to its /64 like django-ratelimit does; ``"unknown"`` when the
    server passed no usable address (then every such caller shares one bucket)."""
    meta_key = getattr(settings, "RATELIMIT_IP_META_KEY", None) or "REMOTE_ADDR"
    raw = str(request.META.get(meta_key) or "").strip()
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return "unknown"
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False).network_address)
    return str(address)


def by_address(group: str, request) -> str:
    """django-ratelimit key function: :func:`client_address`."""
    return client_address(request)


def enforce(
    request, *, group: str, key: Callable[[str, object], str], rate: str, message: str, increment: bool = True
) -> None:
    """Count this request into ``group`` (unless ``increment`` is False) and refuse it when over.

    ``rate``: django-ratelimit syntax (``"600/m"``); ``key``: ``(group, request) -> bucket``.
    Raises DomainError ``rate_limited`` (429, ``Retry-After`` in seconds) with ``message``.
    """
    usage = get_usage(request, group=group, key=key, rate=rate, increment=increment)
    if usage and usage["should_limit"]:
        raise DomainError("rate_limited", message, retry_after=max(1, usage["time_left"]))


#: The per-worker limit of every worker endpoint (``api.base.WorkerAPIView``).
WORKER_GROUP = "worker-api"


def worker_counter(worker_id: str, rate: str, group: str = WORKER_GROUP) -> tuple[str, int, int, int]:
    """django-ratelimit's counter for ``worker_id`` in ``group`` (a view's bucket) now, as ``get_usage``
    would name it: (cache key, counter lifetime in seconds, limit, end of the window in unix s).

    For counting it together with the nonce in one Redis round trip (``api.auth``); the counter is
    the very one :func:`enforce` reads, so both paths count into the same window.
    """
    limit, period = _split_rate(rate)
    window = _get_window(worker_id, period)
    return (
        _make_cache_key(group, window, rate, worker_id, ALL),
        period + EXPIRATION_FUDGE,
        limit,
        window,
    )
