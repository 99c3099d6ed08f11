"""Cron expressions, time zones and fire times: pure rules, no database (``docs/schedules.md``).

Expressions are parsed and evaluated by cronsim (Healthchecks' evaluator): five fields
``minute hour day-of-month month day-of-week``, or six with a leading *seconds* field. A fire
time is computed on the wall clock of the schedule's IANA zone and returned as an aware instant.
Daylight saving time follows Debian cron, as cronsim implements it for five-field expressions
with a fixed minute and hour: a wall time the clocks skip fires at the first instant after the
jump, and a wall time the clocks repeat fires once, at its first occurrence. Expressions whose
minute or hour is a wildcard (``*``, ``*/15``), and every six-field expression, run on elapsed
time instead: every real instant that matches fires, so a repeated hour fires again and a
skipped hour does not.
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

from core.errors import DomainError

MAX_CRON_LENGTH = 120
_ONE_VALUE_RANGE = re.compile(r"^(\w+)-\1/", re.IGNORECASE)
MAX_PREVIEW = 100
#: How many fires :func:`count_fires` counts at most (a misfire decision's ``fires`` saturates here).
MAX_SCAN = 1000


def validate_cron(expression: str, *, field: str = "cron") -> str:
    """Return ``expression`` normalised (single spaces) if cronsim accepts it, else raise.

    Five fields, or six with a leading seconds field. Raises ``DomainError("validation_failed")``
    naming ``field`` for a wrong field count, a value out of range, or an expression that can
    never fire.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise DomainError("validation_failed", "a cron expression is required", field=field)
    if len(expression) > MAX_CRON_LENGTH or not expression.isascii() or "\x00" in expression:
        raise DomainError("validation_failed", f"at most {MAX_CRON_LENGTH} ASCII characters", field=field)
    normalised = " ".join(expression.split())
    if len(normalised.split()) not in (5, 6):
        raise DomainError(
            "validation_failed",
            "must have 5 fields (minute hour day month weekday) or 6 (seconds first)",
            field=field,
        )
    for part in normalised.split():
        for term in part.split(","):
            one_value_range = _ONE_VALUE_RANGE.match(term)
            if one_value_range is not None:
                # cronsim reads N-N/step as N/step (N to the end of the range): refuse the surprise.
                raise DomainError(
                    "validation_failed",
                    f"{term!r}: a one-value range with a step; write {one_value_range.group(1)!r}",
                    field=field,
                )
    try:
        next(CronSim(normalised, datetime(2000, 1, 1, tzinfo=UTC)))
    except CronSimError as exc:
        raise DomainError("validation_failed", f"invalid cron expression: {exc}", field=field) from None
    except StopIteration:
        raise DomainError("validation_failed", "the expression never fires", field=field) from None
    return normalised


def validate_zone(name: str, *, field: str = "timezone") -> ZoneInfo:
    """The IANA zone ``name`` (``Europe/Berlin``, ``UTC``); raises ``validation_failed`` on ``field``."""
    if not isinstance(name, str) or not name or len(name) > 64 or name not in _zones():
        raise DomainError(
            "validation_failed", "must be an IANA time zone name, e.g. Asia/Shanghai", field=field
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise DomainError("validation_failed", "unknown time zone", field=field) from None


@functools.cache
def _zones() -> frozenset[str]:
    """The IANA names this machine's zone database holds (read once per process)."""
    return frozenset(available_timezones()) | {"UTC"}


def describe(expression: str) -> str:
    """A one-line English description of a valid expression ("At 02:30"), or "" if cronsim has none."""
    try:
        return CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC)).explain()
    except Exception:  # explain() is best effort: the expression itself was validated
        return ""


def fires_after(expression: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Fire times strictly after ``after`` (aware), in increasing order, as aware datetimes in ``zone``.

    ``expression`` must be valid (:func:`validate_cron`). Ends when cronsim finds no fire within
    50 years. The local-time evaluation of cronsim can, for an ``after`` inside a repeated hour,
    yield a first instant at or before ``after``; those are dropped here, so the sequence always
    increases strictly.
    """
    last = after.astimezone(UTC)
    for fire in CronSim(expression, after.astimezone(zone)):
        if fire.astimezone(UTC) > last:
            last = fire.astimezone(UTC)
            yield fire


def fires_in_window(
    expression: str, zone: ZoneInfo, after: datetime, *, start: datetime | None, end: datetime | None
) -> Iterator[datetime]:
    """:func:`fires_after` limited to the window ``[start, end]`` (either end open when None)."""
    if start is not None:
        after = max(after, start - timedelta(microseconds=1))
    for fire in fires_after(expression, zone, after):
        if end is not None and fire > end:
            return
        yield fire


def next_fire(
    expression: str,
    zone: ZoneInfo,
    after: datetime,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
) -> datetime | None:
    """The first fire strictly after ``after`` within ``[start, end]`` (UTC-aware), or None."""
    for fire in fires_in_window(expression, zone, after, start=start, end=end):
        return fire.astimezone(UTC)
    return None


#: Look-back windows of :func:`latest_fire_at_or_before`, smallest first.
_WINDOWS = (
    timedelta(seconds=2),
    timedelta(minutes=2),
    timedelta(hours=2),
    timedelta(days=2),
    timedelta(days=64),
    timedelta(days=800),
    timedelta(days=366 * 50),
)


def latest_fire_at_or_before(
    expression: str, zone: ZoneInfo, instant: datetime, *, not_before: datetime
) -> datetime | None:
    """The newest fire in ``[not_before, instant]`` (UTC-aware), or None if there is none.

    Scans forward from ever larger look-back windows (2 s, 2 min, 2 h, 2 days, …), so the scan
    covers few fires whatever the expression's rate, and the answer is a fire of the sequence
    :func:`fires_after` yields.
    """
    for window in _WINDOWS:
        start = max(instant - window, not_before - timedelta(microseconds=1))
        best = None
        for fire in fires_after(expression, zone, start):
            if fire > instant:
                break
            best = fire.astimezone(UTC)
        if best is not None or start <= not_before - timedelta(microseconds=1):
            return best
    return None


def preview(expression: str, zone: ZoneInfo, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` (1…:data:`MAX_PREVIEW`) fires strictly after ``after``, in ``zone``."""
    times = []
    for fire in fires_after(expression, zone, after):
        times.append(fire)
        if len(times) >= count:
            break
    return times


def jitter_offset(schedule_id: uuid.UUID, jitter_seconds: int) -> timedelta:
    """This schedule's fixed delay, 0…``jitter_seconds`` whole seconds, derived from its id.

    Deterministic (SHA-256 of the id), so every replica computes the same due time, and
    schedules sharing an expression spread over the window instead of firing together.
    """
    if jitter_seconds <= 0:
        return timedelta(0)
    digest = hashlib.sha256(schedule_id.bytes).digest()
    return timedelta(seconds=int.from_bytes(digest[:8], "big") % (jitter_seconds + 1))


@dataclass(frozen=True)
class ScheduleSpec:
    """What an operator sets on a schedule (API field names in ``docs/schedules.md``).

    Seconds for ``misfire_grace_seconds`` (0…7 days) and ``jitter_seconds`` (0…3600);
    ``start_at``/``end_at`` aware instants or None; ``priority`` −100…100.
    """

    cron: str
    timezone: str = "UTC"
    enabled: bool = True
    start_at: datetime | None = None
    end_at: datetime | None = None
    overlap: str = "skip"
    misfire: str = "run_once"
    misfire_grace_seconds: int = 300
    jitter_seconds: int = 0
    priority: int = 0
    description: str = ""


#: Fields whose change recomputes the next fire from now.
TIMING_FIELDS = ("cron", "timezone", "enabled", "start_at", "end_at", "jitter_seconds")


def validate_spec(
    spec: ScheduleSpec, *, overlaps: tuple[str, ...], misfires: tuple[str, ...]
) -> ScheduleSpec:
    """``spec`` with its expression normalised; raises ``validation_failed`` naming the API field.

    ``overlaps``/``misfires``: the allowed policy values (the model's choices).
    """
    cron = validate_cron(spec.cron)
    validate_zone(spec.timezone)
    for name, value in (("startAt", spec.start_at), ("endAt", spec.end_at)):
        if value is not None and (value.tzinfo is None or value.utcoffset() is None):
            raise DomainError(
                "validation_failed", "must be an ISO 8601 instant with a UTC offset", field=name
            )
    if spec.start_at is not None and spec.end_at is not None and spec.end_at <= spec.start_at:
        raise DomainError("validation_failed", "must be after startAt", field="endAt")
    if spec.overlap not in overlaps:
        raise DomainError("validation_failed", f"must be one of {', '.join(overlaps)}", field="overlap")
    if spec.misfire not in misfires:
        raise DomainError("validation_failed", f"must be one of {', '.join(misfires)}", field="misfire")
    if not 0 <= spec.misfire_grace_seconds <= 7 * 24 * 3600:
        raise DomainError("validation_failed", "must be 0 to 604800", field="misfireGraceSeconds")
    if not 0 <= spec.jitter_seconds <= 3600:
        raise DomainError("validation_failed", "must be 0 to 3600", field="jitterSeconds")
    if not -100 <= spec.priority <= 100:
        raise DomainError("validation_failed", "must be between -100 and 100", field="priority")
    if len(spec.description) > 200:
        raise DomainError("validation_failed", "at most 200 characters", field="description")
    return replace(spec, cron=cron)


def count_fires(
    expression: str, zone: ZoneInfo, first: datetime, last: datetime, *, cap: int = MAX_SCAN
) -> int:
    """How many fires lie in ``[first, last]`` (``first`` a fire itself), counting at most ``cap``."""
    count = 0
    for fire in fires_after(expression, zone, first - timedelta(microseconds=1)):
        if fire > last or count >= cap:
            break
        count += 1
    return count
