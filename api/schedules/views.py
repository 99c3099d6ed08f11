"""Operator endpoints for schedules: list, create, read, change, delete, and the fire-time preview.

Changing endpoints check the Django model permissions of ``schedules.Schedule`` (add, change,
delete, view) on top of the operator check every operator view makes (``api.base``).
"""

from __future__ import annotations

from dataclasses import replace

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from actions.schedules import schedule_create, schedule_delete, schedule_update
from api.base import OperatorAPIView
from api.query import query_int
from audit.models import ActorType
from core.db import db_now
from core.errors import DomainError
from runs import selectors as run_selectors
from schedules import rules, selectors
from schedules.models import Schedule, ScheduleFire

from . import serializers as s

MAX_LIST = 100
RECENT_FIRES = 10


class ScheduleAPIView(OperatorAPIView):
    """Schedules take the model permissions of ``schedules.Schedule`` (``docs/schedules.md``)."""


def _detail(schedule_id) -> Schedule:
    schedule = selectors.schedule_get(schedule_id)
    recent = list(ScheduleFire.objects.filter(schedule=schedule).order_by("-fire_at")[:RECENT_FIRES])
    setattr(schedule, "recent_fires", recent)  # noqa: B010 (read by ScheduleDetailSerializer)
    return schedule


class ScheduleListView(ScheduleAPIView):
    """Create a schedule on a task (POST); list schedules, optionally of one task (GET)."""

    permissions = {"GET": "schedules.view_schedule", "POST": "schedules.add_schedule"}

    @extend_schema(request=s.ScheduleCreateSerializer, responses={201: s.ScheduleDetailSerializer})
    def post(self, request):
        serializer = s.ScheduleCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        task = run_selectors.task_by_name(serializer.validated_data["task"])
        schedule = schedule_create(
            task_id=task.pk,
            spec=rules.ScheduleSpec(**serializer.spec_changes()),
            user=request.user,
            actor_type=ActorType.API_APP,
            role=self.role,
        )
        return Response(s.ScheduleDetailSerializer(_detail(schedule.pk)).data, status=201)

    @extend_schema(
        parameters=[OpenApiParameter("task", str, required=False, description="only this task's schedules")],
        responses={200: s.ScheduleOutSerializer(many=True)},
    )
    def get(self, request):
        queryset = selectors.schedules_of().order_by("task__name", "created_at")
        task = request.query_params.get("task")
        if task is not None:
            queryset = queryset.filter(task=run_selectors.task_by_name(task))
        return Response(s.ScheduleOutSerializer(queryset[:MAX_LIST], many=True).data)


class ScheduleDetailView(ScheduleAPIView):
    """One schedule: settings, next fire times, last fire and its run, recent fire decisions."""

    http_method_names = ["get", "patch", "delete", "options"]
    permissions = {
        "GET": "schedules.view_schedule",
        "PATCH": "schedules.change_schedule",
        "DELETE": "schedules.delete_schedule",
    }

    @extend_schema(responses={200: s.ScheduleDetailSerializer})
    def get(self, request, schedule_id):
        return Response(s.ScheduleDetailSerializer(_detail(schedule_id)).data)

    @extend_schema(request=s.ScheduleChangeSerializer, responses={200: s.ScheduleDetailSerializer})
    def patch(self, request, schedule_id):
        serializer = s.ScheduleChangeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        current = selectors.schedule_get(schedule_id)
        spec = replace(spec_of(current), **serializer.spec_changes())
        # The change is merged onto the version just read: a concurrent change answers 409.
        schedule = schedule_update(
            schedule_id=current.pk,
            spec=spec,
            expected_version=serializer.validated_data.get("expectedVersion", current.version),
            user=request.user,
            actor_type=ActorType.API_APP,
            role=self.role,
        )
        return Response(s.ScheduleDetailSerializer(_detail(schedule.pk)).data)

    @extend_schema(responses={204: None})
    def delete(self, request, schedule_id):
        schedule_delete(
            schedule_id=schedule_id, user=request.user, actor_type=ActorType.API_APP, role=self.role
        )
        return Response(status=204)


def spec_of(schedule: Schedule) -> rules.ScheduleSpec:
    """The settings of a stored schedule, as the spec a change starts from."""
    return rules.ScheduleSpec(
        cron=schedule.cron,
        timezone=schedule.timezone,
        enabled=schedule.enabled,
        start_at=schedule.start_at,
        end_at=schedule.end_at,
        overlap=schedule.overlap,
        misfire=schedule.misfire,
        misfire_grace_seconds=schedule.misfire_grace_seconds,
        jitter_seconds=schedule.jitter_seconds,
        priority=schedule.priority,
        description=schedule.description,
    )


def _query_int(request, name: str, default: int, low: int, high: int) -> int:
    value = query_int(request, name, default=default, low=low, high=high)
    assert value is not None  # a default is given
    return value


class SchedulePreviewView(OperatorAPIView):
    """The next ``count`` fire times of an expression in a zone after an instant (default now)."""

    http_method_names = ["get", "options"]
    permissions = {"GET": "schedules.view_schedule"}

    @extend_schema(
        parameters=[
            OpenApiParameter("cron", str, required=True, description="5 fields, or 6 with seconds first"),
            OpenApiParameter("timezone", str, required=False, description="IANA zone (default UTC)"),
            OpenApiParameter("count", int, required=False, description=f"1…{rules.MAX_PREVIEW} (default 10)"),
            OpenApiParameter(
                "after", str, required=False, description="ISO 8601 instant with offset (default now)"
            ),
        ],
        responses={200: s.PreviewOutSerializer},
    )
    def get(self, request):
        params = request.query_params
        cron = rules.validate_cron(params.get("cron", ""), field="cron")
        zone_name = params.get("timezone", "UTC")
        zone = rules.validate_zone(zone_name, field="timezone")
        count = _query_int(request, "count", 10, 1, rules.MAX_PREVIEW)
        if "after" in params:
            try:
                after = s.parse_instant(params["after"])
            except ValueError as exc:
                raise DomainError("validation_failed", str(exc), field="after") from None
        else:
            after = db_now()
        times = rules.preview(cron, zone, after, count)
        return Response(
            s.PreviewOutSerializer(
                {
                    "cron": cron,
                    "timezone": zone_name,
                    "after": after.isoformat(),
                    "explanation": rules.describe(cron),
                    "fireTimes": [t.isoformat() for t in times],
                }
            ).data
        )
