"""Property: for random valid expressions and zones, preview times strictly increase and each one
matches the expression on its zone's wall clock — or, for a wall time the clocks skipped, is the
first instant after the jump (``docs/schedules.md`` Daylight saving time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from core.errors import DomainError
from schedules import rules

# (low, high) of each field: second, minute, hour, day of month, month, day of week (0 = Sunday).
RANGES = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "day": (1, 31),
    "month": (1, 12),
    "weekday": (0, 6),
}


@st.composite
def field(draw, name):
    low, high = RANGES[name]
    kind = draw(st.sampled_from(["star", "step", "list", "range", "range_step"]))
    if kind == "star":
        return "*", set(range(low, high + 1))
    if kind == "step":
        step = draw(st.integers(1, high - low))
        return f"*/{step}", set(range(low, high + 1, step))
    if kind == "list":
        values = draw(st.sets(st.integers(low, high), min_size=1, max_size=4))
        return ",".join(map(str, sorted(values))), values
    start = draw(st.integers(low, high))
    end = draw(st.integers(start, high))
    if kind == "range":
        return f"{start}-{end}", set(range(start, end + 1))
    step = draw(st.integers(1, max(1, end - start)))
    return f"{start}-{end}/{step}", set(range(start, end + 1, step))


@st.composite
def expressions(draw):
    with_seconds = draw(st.booleans())
    names = (["second"] if with_seconds else []) + ["minute", "hour", "day", "month", "weekday"]
    parts = {name: draw(field(name)) for name in names}
    text = " ".join(parts[name][0] for name in names)
    sets = {name: parts[name][1] for name in names}
    sets.setdefault("second", {0})
    return text, sets, parts["day"][0].startswith("*") or parts["weekday"][0].startswith("*")


def wall_matches(local: datetime, sets, day_and: bool) -> bool:
    weekday = (local.weekday() + 1) % 7
    dom, dow = local.day in sets["day"], weekday in sets["weekday"]
    day_ok = (dom and dow) if day_and else (dom or dow)
    return (
        local.second in sets["second"]
        and local.minute in sets["minute"]
        and local.hour in sets["hour"]
        and local.month in sets["month"]
        and day_ok
    )


def matches(fire: datetime, zone: ZoneInfo, sets, day_and: bool) -> bool:
    local = fire.astimezone(zone)
    if wall_matches(local, sets, day_and):
        return True
    # A skipped wall time: the fire is the first instant after the clocks jumped forward, and a
    # wall time the clocks skipped that day matches.
    before = (fire.astimezone(UTC) - timedelta(seconds=1)).astimezone(zone)
    skipped = local.replace(tzinfo=None) - before.replace(tzinfo=None) - timedelta(seconds=1)
    if skipped <= timedelta(0):
        return False
    wall = before.replace(tzinfo=None) + timedelta(seconds=1)
    while wall < local.replace(tzinfo=None):
        if wall_matches(wall, sets, day_and):
            return True
        wall += timedelta(seconds=1 if len(sets["second"]) < 60 else 60)
    return False


#: Instants just before common DST transitions (EU, US, Australia/NZ, Lord Howe's 30 minutes),
#: so the skipped and repeated hours are exercised, not only ordinary days.
TRANSITIONS = [
    datetime(2026, 3, 29, 0, tzinfo=UTC),
    datetime(2026, 10, 25, 0, tzinfo=UTC),
    datetime(2026, 3, 8, 6, tzinfo=UTC),
    datetime(2026, 11, 1, 5, tzinfo=UTC),
    datetime(2026, 4, 4, 15, tzinfo=UTC),
    datetime(2026, 9, 26, 13, tzinfo=UTC),
    datetime(2026, 4, 4, 14, 30, tzinfo=UTC),
]
DST_ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "America/Santiago",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Pacific/Auckland",
    "Asia/Shanghai",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    expression=expressions(),
    zone_name=st.one_of(st.timezone_keys(allow_prefix=False), st.sampled_from(DST_ZONES)),
    after=st.one_of(
        st.datetimes(
            min_value=datetime(2000, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC)
        ),
        st.builds(
            lambda base, minutes: base - timedelta(minutes=minutes),
            st.sampled_from(TRANSITIONS),
            st.integers(0, 24 * 60),
        ),
    ),
    count=st.integers(1, 12),
)
def test_preview_times_strictly_increase_and_match_the_expression_in_their_zone(
    expression, zone_name, after, count
):
    text, sets, day_and = expression
    try:
        cron = rules.validate_cron(text)
    except DomainError:
        assume(False)  # an expression that can never fire (31 February) is refused, rightly
    zone = rules.validate_zone(zone_name)
    times = rules.preview(cron, zone, after, count)
    instants = [t.astimezone(UTC) for t in times]
    assert all(a < b for a, b in zip([after, *instants], instants, strict=False)), times
    for fire in times:
        assert matches(fire, zone, sets, day_and), (text, zone_name, fire.isoformat())
