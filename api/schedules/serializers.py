"""Operator API shapes for schedules (camelCase, strict input; ``docs/schedules.md``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.base import StrictBooleanField, StrictCharField, StrictIntegerField, StrictSerializer
from schedules import rules, selectors
from schedules.models import MAX_GRACE_SECONDS, MAX_JITTER_SECONDS, MisfirePolicy, OverlapPolicy, Schedule

#: How many next fire times a schedule's answer lists.
UPCOMING = 5
#: Instants the API accepts (fire times are computed within 50 years of them).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)


def parse_instant(value: object) -> datetime:
    """An ISO 8601 instant with a UTC offset (``Z`` or ``±hh:mm``), 1970…2200; ValueError otherwise.

    A ``+`` left unencoded in a query string arrives as a space; it is read as ``+`` again.
    """
    if not isinstance(value, str) or len(value) > 40:
        raise ValueError("must be an ISO 8601 instant with a UTC offset")
    text = value.strip()
    if "T" in text and " " in text:
        text = text.replace(" ", "+")
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("must be an ISO 8601 instant with a UTC offset, e.g. 2026-03-29T00:00:00Z") from None
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError("must carry a UTC offset (Z or +hh:mm)")
    if not EARLIEST <= instant <= LATEST:
        raise ValueError("must lie between 1970 and 2200")
    return instant


@extend_schema_field(OpenApiTypes.DATETIME)
class InstantField(serializers.Field):
    """An aware instant in, ISO 8601 with offset out (null allowed where the field says so)."""

    def to_internal_value(self, data):
        try:
            return parse_instant(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value):
        return value.isoformat() if value is not None else None


class ScheduleFieldsSerializer(StrictSerializer):
    """Every settable field; all optional here (PATCH), defaults applied on create."""

    cron = StrictCharField(
        max_length=rules.MAX_CRON_LENGTH, required=False, help_text="5 fields, or 6 with seconds first"
    )
    timezone = StrictCharField(max_length=64, required=False, help_text="IANA zone, e.g. Asia/Shanghai")
    enabled = StrictBooleanField(required=False)
    startAt = InstantField(required=False, allow_null=True)
    endAt = InstantField(required=False, allow_null=True)
    overlap = serializers.ChoiceField(choices=OverlapPolicy.values, required=False)
    misfire = serializers.ChoiceField(choices=MisfirePolicy.values, required=False)
    misfireGraceSeconds = StrictIntegerField(min_value=0, max_value=MAX_GRACE_SECONDS, required=False)
    jitterSeconds = StrictIntegerField(min_value=0, max_value=MAX_JITTER_SECONDS, required=False)
    priority = StrictIntegerField(min_value=-100, max_value=100, required=False)
    description = StrictCharField(max_length=200, required=False, allow_blank=True)

    #: API name → ScheduleSpec attribute.
    SPEC_FIELDS = {
        "cron": "cron",
        "timezone": "timezone",
        "enabled": "enabled",
        "startAt": "start_at",
        "endAt": "end_at",
        "overlap": "overlap",
        "misfire": "misfire",
        "misfireGraceSeconds": "misfire_grace_seconds",
        "jitterSeconds": "jitter_seconds",
        "priority": "priority",
        "description": "description",
    }

    def spec_changes(self) -> dict[str, object]:
        return {
            self.SPEC_FIELDS[key]: value
            for key, value in self.validated_data.items()
            if key in self.SPEC_FIELDS
        }


class ScheduleCreateSerializer(ScheduleFieldsSerializer):
    task = StrictCharField(max_length=100, help_text="task name")
    cron = StrictCharField(max_length=rules.MAX_CRON_LENGTH, help_text="5 fields, or 6 with seconds first")


class ScheduleChangeSerializer(ScheduleFieldsSerializer):
    expectedVersion = StrictIntegerField(
        min_value=0, required=False, help_text="the version you read; a stale one answers 409"
    )


class FireOutSerializer(serializers.Serializer):
    fireAt = InstantField(source="fire_at")
    dueAt = InstantField(source="due_at")
    decidedAt = InstantField(source="decided_at")
    outcome = serializers.CharField()
    fires = serializers.IntegerField(help_text="fires this decision stands for (a misfire covers several)")
    runId = serializers.UUIDField(source="run_id", allow_null=True)


class RunRefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.CharField()


class ScheduleOutSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    taskId = serializers.UUIDField(source="task_id")
    taskName = serializers.CharField(source="task.name")
    description = serializers.CharField()
    cron = serializers.CharField()
    explanation = serializers.SerializerMethodField(help_text="the expression in English (cronsim)")
    timezone = serializers.CharField()
    enabled = serializers.BooleanField()
    startAt = InstantField(source="start_at", allow_null=True)
    endAt = InstantField(source="end_at", allow_null=True)
    overlap = serializers.CharField()
    misfire = serializers.CharField()
    misfireGraceSeconds = serializers.IntegerField(source="misfire_grace_seconds")
    jitterSeconds = serializers.IntegerField(source="jitter_seconds")
    jitterOffsetSeconds = serializers.SerializerMethodField(help_text="this schedule's fixed delay")
    priority = serializers.IntegerField()
    version = serializers.IntegerField()
    nextFireAt = serializers.SerializerMethodField(help_text="in the schedule's zone, with its offset")
    dueAt = InstantField(source="due_at", allow_null=True)
    nextFireTimes = serializers.SerializerMethodField()
    pendingFireAt = InstantField(source="pending_fire_at", allow_null=True)
    lastFireAt = serializers.SerializerMethodField()
    lastOutcome = serializers.CharField(source="last_outcome")
    lastRun = RunRefSerializer(source="last_run", allow_null=True)
    createdAt = InstantField(source="created_at")
    updatedAt = InstantField(source="updated_at")

    def _local(self, schedule: Schedule, value: datetime | None) -> str | None:
        return value.astimezone(ZoneInfo(schedule.timezone)).isoformat() if value is not None else None

    def get_explanation(self, schedule: Schedule) -> str:
        return rules.describe(schedule.cron)

    def get_jitterOffsetSeconds(self, schedule: Schedule) -> int:
        return int(rules.jitter_offset(schedule.pk, schedule.jitter_seconds).total_seconds())

    def get_nextFireAt(self, schedule: Schedule) -> str | None:
        return self._local(schedule, schedule.next_fire_at)

    def get_lastFireAt(self, schedule: Schedule) -> str | None:
        return self._local(schedule, schedule.last_fire_at)

    def get_nextFireTimes(self, schedule: Schedule) -> list[str]:
        if schedule.next_fire_at is None:
            return []
        # From just before the stored next fire, so the list starts with it.
        after = schedule.next_fire_at - timedelta(microseconds=1)
        return [t.isoformat() for t in selectors.upcoming(schedule, UPCOMING, after=after)]


class ScheduleDetailSerializer(ScheduleOutSerializer):
    recentFires = FireOutSerializer(many=True, source="recent_fires")


class PreviewOutSerializer(serializers.Serializer):
    cron = serializers.CharField()
    timezone = serializers.CharField()
    after = serializers.CharField(help_text="the instant the fires follow, ISO 8601")
    explanation = serializers.CharField()
    fireTimes = serializers.ListField(
        child=serializers.CharField(), help_text="ISO 8601 instants with the zone's UTC offset, increasing"
    )
