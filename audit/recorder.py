"""Writing event rows. Called only from inside a service's transaction; opens none of its own."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from core.wakeups import worker_changed

from .models import ActorType, Event

#: Events after which a worker's waiting requests must look again (fence, capacity, drain).
WAKE_WORKER_KINDS = frozenset(
    {
        "session.registered",
        "credential.rotation_forced",
        "session.replaced",
        "session.fenced",
        "session.expired",
        "session.offline",
        "session.drained",
        "session.undrained",
        "worker.revoked",
        "worker.drained",
        "worker.undrained",
        "lease.released",
        "lease.completed",
    }
)

#: Values an event's ``data`` may hold: short strings (codes, categories), numbers, booleans,
#: or one level of {category: count}. Anything else is a programming error.
_MAX_TEXT = 64


def _check(data: dict[str, Any]) -> None:
    for key, value in data.items():
        if isinstance(value, dict):
            if not all(isinstance(k, str) and type(v) is int for k, v in value.items()) or len(value) > 16:
                raise ValueError(f"event data {key!r} must be a small {{category: count}} map")
        elif isinstance(value, str):
            if len(value) > _MAX_TEXT:
                raise ValueError(f"event data {key!r} is longer than {_MAX_TEXT} characters")
        elif value is not None and not isinstance(value, bool | int | float):
            raise ValueError(f"event data {key!r} must be a scalar, not {type(value).__name__}")


def record(
    kind: str,
    *,
    actor_type: ActorType | str,
    actor: str = "",
    worker_id: uuid.UUID | None = None,
    session_id: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
    attempt_id: uuid.UUID | None = None,
    lease_id: uuid.UUID | None = None,
    run_sequence: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    """Append one event row (``kind`` like ``session.replaced``; ``data`` low-cardinality only).

    Raises ValueError if ``data`` holds anything but short scalars or a {category: count} map.
    """
    data = data or {}
    _check(data)
    if worker_id is not None and kind in WAKE_WORKER_KINDS:
        worker_changed(worker_id)  # delivered on commit (core.wakeups)
    return Event.objects.create(
        kind=kind,
        actor_type=actor_type,
        actor=actor[:150],
        worker_id=worker_id,
        session_id=session_id,
        run_id=run_id,
        attempt_id=attempt_id,
        lease_id=lease_id,
        run_sequence=run_sequence,
        data=data,
    )


def record_aggregated(
    kind: str,
    *,
    now,
    window_seconds: int,
    actor_type: ActorType | str,
    worker_id: uuid.UUID,
    data: dict[str, Any] | None = None,
) -> Event:
    """Count a refusal that can flood (a registration storm) in one row per worker per window.

    The first ``kind`` event of ``worker_id`` in the last ``window_seconds`` (database time
    ``now``) is written with ``data`` and ``count`` 1; later ones in the window only raise its
    ``count`` (and refresh ``data``). The caller holds the worker's row lock, so two refusals of
    one worker never race on the row. Raises ValueError like :func:`record`.
    """
    data = dict(data or {})
    _check(data)
    since = now - timedelta(seconds=window_seconds)
    current = (
        Event.objects.filter(worker_id=worker_id, kind=kind, created_at__gt=since).order_by("-id").first()
    )
    if current is None:
        return record(kind, actor_type=actor_type, worker_id=worker_id, data={**data, "count": 1})
    current.data = {**data, "count": int(current.data.get("count", 1)) + 1}
    current.save(update_fields=["data"])
    return current
