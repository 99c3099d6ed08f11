"""Cron evaluation with cronsim: DST in the documented way, the optional seconds field, refusals
naming the field, deterministic jitter (``docs/schedules.md``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from core.errors import DomainError
from schedules import rules

BERLIN, SHANGHAI, NEW_YORK = (
    ZoneInfo("Europe/Berlin"),
    ZoneInfo("Asia/Shanghai"),
    ZoneInfo("America/New_York"),
)


def iso(times):
    return [t.isoformat() for t in times]


def test_daily_0230_in_berlin_fires_once_on_the_spring_forward_day_at_0300_cest():
    # 2026-03-29: clocks jump from 02:00 CET to 03:00 CEST; 02:30 does not exist that day.
    times = rules.preview("30 2 * * *", BERLIN, datetime(2026, 3, 27, 12, tzinfo=UTC), 4)
    assert iso(times) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # the first instant after the jump
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_daily_0230_in_berlin_fires_once_on_the_fall_back_day_at_its_first_occurrence():
    # 2026-10-25: clocks fall back from 03:00 CEST to 02:00 CET; 02:30 happens twice.
    times = rules.preview("30 2 * * *", BERLIN, datetime(2026, 10, 23, 12, tzinfo=UTC), 4)
    assert iso(times) == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",  # once: the first 02:30 (00:30 UTC), not again at 01:30 UTC
        "2026-10-26T02:30:00+01:00",
        "2026-10-27T02:30:00+01:00",
    ]
    days = [t.date() for t in times]
    assert len(days) == len(set(days))


def test_hourly_in_new_york_skips_the_missing_hour_and_fires_in_both_repeated_hours():
    spring = rules.preview("0 * * * *", NEW_YORK, datetime(2026, 3, 8, 5, tzinfo=UTC), 4)
    assert iso(spring) == [
        "2026-03-08T01:00:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:00 EST never happens: one real hour later
        "2026-03-08T04:00:00-04:00",
        "2026-03-08T05:00:00-04:00",
    ]
    fall = rules.preview("0 * * * *", NEW_YORK, datetime(2026, 11, 1, 4, tzinfo=UTC), 4)
    assert iso(fall) == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",  # the repeated hour fires again: every real hour fires
        "2026-11-01T02:00:00-05:00",
        "2026-11-01T03:00:00-05:00",
    ]
    for times in (spring, fall):
        gaps = {b.astimezone(UTC) - a.astimezone(UTC) for a, b in zip(times, times[1:], strict=False)}
        assert gaps == {timedelta(hours=1)}


def test_hourly_in_shanghai_is_every_real_hour_on_both_us_transition_dates():
    # China keeps no DST: the New York transition dates are ordinary days there.
    for start in (datetime(2026, 3, 8, 5, tzinfo=UTC), datetime(2026, 11, 1, 4, tzinfo=UTC)):
        times = rules.preview("0 * * * *", SHANGHAI, start, 24)
        assert all(t.utcoffset() == timedelta(hours=8) for t in times)
        assert [t.astimezone(UTC) for t in times] == [start + timedelta(hours=h + 1) for h in range(24)]


def test_a_wildcard_minute_in_the_repeated_hour_fires_on_elapsed_time():
    times = rules.preview("*/30 * * * *", BERLIN, datetime(2026, 10, 24, 23, 45, tzinfo=UTC), 6)
    assert iso(times) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T03:30:00+01:00",
    ]


def test_six_fields_put_seconds_first():
    times = rules.preview("*/20 * * * * *", ZoneInfo("UTC"), datetime(2026, 1, 1, tzinfo=UTC), 4)
    assert iso(times) == [
        "2026-01-01T00:00:20+00:00",
        "2026-01-01T00:00:40+00:00",
        "2026-01-01T00:01:00+00:00",
        "2026-01-01T00:01:20+00:00",
    ]


def test_fires_are_strictly_after_the_instant_even_inside_a_repeated_hour():
    # 02:15 CET (the second 02:15) is after the first 02:30: that one is not "next" any more.
    after = datetime(2026, 10, 25, 1, 15, tzinfo=UTC)
    assert iso(rules.preview("30 2 * * *", BERLIN, after, 1)) == ["2026-10-26T02:30:00+01:00"]
    assert rules.preview("0 3 * * *", BERLIN, datetime(2026, 1, 1, 2, tzinfo=UTC), 1)[0] > datetime(
        2026, 1, 1, 2, tzinfo=UTC
    )


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "   ",
        "* * * *",
        "* * * * * * *",
        "61 * * * *",
        "* 24 * * *",
        "0 0 30 2 *",
        "a b c d e",
        "*/0 * * * *",
        "é * * * *",
    ],
)
def test_invalid_expressions_are_refused_naming_the_field(expression):
    with pytest.raises(DomainError) as refused:
        rules.validate_cron(expression)
    assert (refused.value.code, refused.value.field) == ("validation_failed", "cron")


@pytest.mark.parametrize("zone", ["", "Mars/Olympus", "Europe/berlin", "../etc/passwd", "UTC+8", "x" * 65])
def test_invalid_zones_are_refused_naming_the_field(zone):
    with pytest.raises(DomainError) as refused:
        rules.validate_zone(zone)
    assert (refused.value.code, refused.value.field) == ("validation_failed", "timezone")


def test_jitter_is_fixed_per_schedule_and_within_the_window():
    ids = [uuid.UUID(int=i * 7919) for i in range(1, 200)]
    offsets = [rules.jitter_offset(i, 60) for i in ids]
    assert offsets == [rules.jitter_offset(i, 60) for i in ids]  # every replica computes the same
    assert all(timedelta(0) <= o <= timedelta(seconds=60) for o in offsets)
    assert len(set(offsets)) > 30  # spread, not bunched
    assert rules.jitter_offset(ids[0], 0) == timedelta(0)


def test_the_newest_fire_before_an_instant_follows_the_same_dst_rules():
    first = datetime(2026, 3, 1, tzinfo=UTC)
    assert rules.latest_fire_at_or_before(
        "30 2 * * *", BERLIN, datetime(2026, 3, 29, 1, 10, tzinfo=UTC), not_before=first
    ) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert rules.latest_fire_at_or_before(
        "30 2 * * *", BERLIN, datetime(2026, 10, 25, 1, 45, tzinfo=UTC), not_before=first
    ) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert (
        rules.latest_fire_at_or_before(
            "0 0 1 1 *", BERLIN, datetime(2026, 6, 1, tzinfo=UTC), not_before=datetime(2026, 2, 1, tzinfo=UTC)
        )
        is None
    )
    assert rules.count_fires("* * * * * *", BERLIN, first, first + timedelta(hours=1)) == rules.MAX_SCAN


def test_admission_moves_from_fire_to_fire_once_a_day_across_both_berlin_transitions():
    # Admission moves next_fire_at with rules.next_fire(…, after=the fire it decided).
    for start, expected in (
        (
            datetime(2026, 3, 27, 12, tzinfo=UTC),
            ["2026-03-28T01:30:00+00:00", "2026-03-29T01:00:00+00:00", "2026-03-30T00:30:00+00:00"],
        ),
        (
            datetime(2026, 10, 23, 12, tzinfo=UTC),
            ["2026-10-24T00:30:00+00:00", "2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"],
        ),
    ):
        chain, fire = [], start
        for _ in range(3):
            fire = rules.next_fire("30 2 * * *", BERLIN, fire)
            chain.append(fire.isoformat())
        assert chain == expected
