"""The standalone profile's replay memory: every accepted nonce, exactly, until it expires.

The cluster profile keeps nonces in Redis (``cache.add`` = ``SET NX``, shared by all replicas).
The standalone profile is one process, so it keeps them in memory — but not in Django's locmem
cache, which evicts least-recently-used entries once it holds ``MAX_ENTRIES`` (300 by default):
a nonce is never read again after it is stored, so it would be the first to go, and the request
carrying it could be replayed inside its window. This store forgets a nonce only when it expires,
and when it is full of unexpired nonces it refuses new requests (503, retryable) rather than
forget one: replay protection fails closed.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from core.errors import DomainError


class ProcessNonceStore:
    """A bounded set of keys, each remembered for a fixed ``ttl_seconds`` (monotonic clock).

    Entries expire in insertion order (one TTL for all), so expiry is a pop from the left of a
    deque: O(1) amortised per call, thread safe under one lock.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._expires: dict[str, float] = {}
        self._order: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._expires)

    def add(self, key: str, ttl_seconds: float, *, now: float | None = None) -> bool:
        """Remember ``key`` for ``ttl_seconds``; False if it is already remembered.

        Raises DomainError ``storage_busy`` (503) when ``capacity`` unexpired keys are held.
        """
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._order and self._order[0][0] <= now:
                expiry, old = self._order.popleft()
                if self._expires.get(old) == expiry:
                    del self._expires[old]
            if key in self._expires:
                return False
            if len(self._expires) >= self.capacity:
                raise DomainError(
                    "storage_busy",
                    f"the replay store holds {self.capacity} unexpired nonces; retry shortly",
                    retry_after=max(1, int(self._order[0][0] - now) + 1),
                )
            expiry = now + ttl_seconds
            self._expires[key] = expiry
            self._order.append((expiry, key))
            return True
