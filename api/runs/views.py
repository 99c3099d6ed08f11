"""Operator endpoints for other systems: create tasks and revisions, enqueue, cancel, read runs."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from actions.runs import run_cancel, run_enqueue
from actions.tasks import revision_create, task_create
from api.base import OperatorAPIView
from audit.models import ActorType
from core.errors import DomainError
from runs import selectors
from runs.models import Run, RunAttempt
from runs.states import RunState

from . import serializers as s

MAX_LIST = 100


def _run_queryset():
    return Run.objects.select_related("task", "revision", "schedule_fire").prefetch_related(
        Prefetch("attempts", queryset=RunAttempt.objects.select_related("worker").order_by("number"))
    )


def _run(run_id) -> Run:
    run = _run_queryset().filter(pk=run_id).first()
    if run is None:
        raise DomainError("run_not_found", "no such run")
    return run


class TaskListView(OperatorAPIView):
    """Create a task with its first revision."""

    @extend_schema(request=s.TaskInSerializer, responses={201: s.RevisionOutSerializer})
    def post(self, request):
        serializer = s.TaskInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        revision = task_create(
            name=serializer.validated_data["name"],
            description=serializer.validated_data["description"],
            spec=serializer.to_spec(),
            user=request.user,
        )
        return Response(s.RevisionOutSerializer(revision).data, status=201)


class RevisionListView(OperatorAPIView):
    """Add an immutable revision to a task (runs enqueued afterwards pin it)."""

    @extend_schema(request=s.RevisionInSerializer, responses={201: s.RevisionOutSerializer})
    def post(self, request, name: str):
        serializer = s.RevisionInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        task = selectors.task_by_name(name)
        revision = revision_create(task_id=task.pk, spec=serializer.to_spec(), user=request.user)
        return Response(s.RevisionOutSerializer(revision).data, status=201)


class RunListView(OperatorAPIView):
    """Enqueue a run (POST); list recent runs, optionally by state (GET)."""

    @extend_schema(request=s.EnqueueSerializer, responses={201: s.RunOutSerializer})
    def post(self, request):
        serializer = s.EnqueueSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        revision_id = (
            data.get("revisionId") or selectors.latest_revision(selectors.task_by_name(data["task"])).pk
        )
        run = run_enqueue(
            revision_id=revision_id,
            priority=data["priority"],
            actor_type=ActorType.API_APP,
            actor=request.user.get_username(),
        )
        return Response(s.RunOutSerializer(_run(run.pk)).data, status=201)

    @extend_schema(
        parameters=[OpenApiParameter("state", str, enum=RunState.values, required=False)],
        responses={200: s.RunOutSerializer(many=True)},
    )
    def get(self, request):
        queryset = _run_queryset().order_by("-created_at")
        state = request.query_params.get("state")
        if state is not None:
            if state not in RunState.values:
                raise DomainError(
                    "validation_failed", f"must be one of {', '.join(RunState.values)}", field="state"
                )
            queryset = queryset.filter(state=state)
        return Response(s.RunOutSerializer(queryset[:MAX_LIST], many=True).data)


class RunDetailView(OperatorAPIView):
    """One run with its attempts, outcome and (while waiting) its placement mismatch summary."""

    @extend_schema(responses={200: s.RunOutSerializer})
    def get(self, request, run_id):
        return Response(s.RunOutSerializer(_run(run_id)).data)


class RunCancelView(OperatorAPIView):
    """Request cancellation; answers whether it was recorded now, before, or the run had ended."""

    @extend_schema(request=s.CancelSerializer, responses={202: s.CancelOutSerializer})
    def post(self, request, run_id):
        serializer = s.CancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        result = run_cancel(
            run_id=run_id,
            reason=serializer.validated_data["reason"],
            actor_type=ActorType.API_APP,
            actor=request.user.get_username(),
        )
        return Response(
            s.CancelOutSerializer({"status": result.status, "run": _run(run_id)}).data, status=202
        )
