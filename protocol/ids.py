"""Identifiers: UUIDv7 (RFC 9562) from the maintained ``uuid6`` package."""

from __future__ import annotations

import uuid

from uuid6 import uuid7 as _uuid7


def uuid7() -> uuid.UUID:
    """A new time-ordered UUIDv7 (session ids, run/attempt/lease ids, offer ids)."""
    return uuid.UUID(int=_uuid7().int)


def is_uuid7(value: uuid.UUID) -> bool:
    """True when ``value`` is an RFC 9562 version-7 UUID."""
    return value.version == 7 and value.variant == uuid.RFC_4122
