"""Operator endpoints for other systems: tasks and revisions (create, list, read), runs (enqueue,
list, read, cancel, retry). Each method names its permission (``docs/operators.md``)."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from actions.runs import run_cancel, run_enqueue, run_retry
from actions.tasks import revision_create, task_create
from api.base import EmptySerializer, OperatorAPIView
from api.pagination import page_of, paginate
from audit.models import ActorType
from core.errors import DomainError
from runs import selectors
from runs.models import Run, RunAttempt, Task, TaskRevision
from runs.states import RunState

from . import serializers as s

CURSOR = [
    OpenApiParameter("cursor", str, required=False, description="from `next`/`previous` of a page"),
    OpenApiParameter("limit", int, required=False, description="page size, 1-200 (default 50)"),
]


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
    """List tasks (GET); create a task with its first revision (POST)."""

    permissions = {"GET": "runs.view_task", "POST": "runs.add_task"}

    @extend_schema(
        parameters=CURSOR, responses={200: page_of(s.TaskOutSerializer)}, operation_id="ops_tasks_list"
    )
    def get(self, request):
        return paginate(request, self, Task.objects.all(), s.TaskOutSerializer, ordering=("name",))

    @extend_schema(request=s.TaskInSerializer, responses={201: s.RevisionOutSerializer})
    def post(self, request):
        serializer = s.TaskInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        revision = task_create(
            name=serializer.validated_data["name"],
            description=serializer.validated_data["description"],
            spec=serializer.to_spec(),
            user=request.user,
            role=self.role,
        )
        return Response(s.RevisionOutSerializer(revision).data, status=201)


class TaskDetailView(OperatorAPIView):
    """One task with its newest revision number."""

    permissions = {"GET": "runs.view_task"}

    @extend_schema(responses={200: s.TaskOutSerializer})
    def get(self, request, name: str):
        return Response(s.TaskOutSerializer(selectors.task_by_name(name)).data)


class RevisionListView(OperatorAPIView):
    """List a task's revisions, newest first (GET); add an immutable revision (POST; runs
    enqueued afterwards pin it)."""

    permissions = {"GET": "runs.view_taskrevision", "POST": "runs.add_taskrevision"}

    @extend_schema(
        parameters=CURSOR,
        responses={200: page_of(s.RevisionDetailSerializer)},
        operation_id="ops_tasks_revisions_list",
    )
    def get(self, request, name: str):
        task = selectors.task_by_name(name)
        revisions = TaskRevision.objects.filter(task=task).select_related("task")
        return paginate(request, self, revisions, s.RevisionDetailSerializer, ordering=("-number",))

    @extend_schema(request=s.RevisionInSerializer, responses={201: s.RevisionOutSerializer})
    def post(self, request, name: str):
        serializer = s.RevisionInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        task = selectors.task_by_name(name)
        revision = revision_create(
            task_id=task.pk, spec=serializer.to_spec(), user=request.user, role=self.role
        )
        return Response(s.RevisionOutSerializer(revision).data, status=201)


class RevisionDetailView(OperatorAPIView):
    """One revision of a task, by number: command, environment names, timeout, placement, retry."""

    permissions = {"GET": "runs.view_taskrevision"}

    @extend_schema(responses={200: s.RevisionDetailSerializer})
    def get(self, request, name: str, number: int):
        revision = TaskRevision.objects.filter(task__name=name, number=number).select_related("task").first()
        if revision is None:
            raise DomainError("revision_not_found", "no such task revision")
        return Response(s.RevisionDetailSerializer(revision).data)


class RunListView(OperatorAPIView):
    """Enqueue a run (POST); list runs newest first, optionally by state or task (GET)."""

    permissions = {"GET": "runs.view_run", "POST": "runs.run_task"}

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
            actor=self.actor,
            role=self.role,
        )
        return Response(s.RunOutSerializer(_run(run.pk)).data, status=201)

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=RunState.values, required=False),
            OpenApiParameter("task", str, required=False, description="task name"),
            *CURSOR,
        ],
        responses={200: page_of(s.RunOutSerializer)},
        operation_id="ops_runs_list",
    )
    def get(self, request):
        queryset = _run_queryset()
        task = request.query_params.get("task")
        if task is not None:
            queryset = queryset.filter(task__name=task)
        state = request.query_params.get("state")
        if state is not None:
            if state not in RunState.values:
                raise DomainError(
                    "validation_failed", f"must be one of {', '.join(RunState.values)}", field="state"
                )
            queryset = queryset.filter(state=state)
        return paginate(request, self, queryset, s.RunOutSerializer, ordering=("-id",))


class RunDetailView(OperatorAPIView):
    """One run with its attempts, outcome and (while waiting) its placement mismatch summary."""

    permissions = {"GET": "runs.view_run"}

    @extend_schema(responses={200: s.RunOutSerializer})
    def get(self, request, run_id):
        return Response(s.RunOutSerializer(_run(run_id)).data)


class RunCancelView(OperatorAPIView):
    """Request cancellation; answers whether it was recorded now, before, or the run had ended."""

    permissions = {"POST": "runs.cancel_run"}

    @extend_schema(request=s.CancelSerializer, responses={202: s.CancelOutSerializer})
    def post(self, request, run_id):
        serializer = s.CancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        result = run_cancel(
            run_id=run_id,
            reason=serializer.validated_data["reason"],
            actor_type=ActorType.API_APP,
            actor=self.actor,
            role=self.role,
        )
        return Response(
            s.CancelOutSerializer({"status": result.status, "run": _run(run_id)}).data, status=202
        )


class RunRetryView(OperatorAPIView):
    """Retry a finished run: a new run of the same revision, linked to it (``retryOf``).
    Refused with 409 ``run_not_finished`` while the run is live."""

    permissions = {"POST": "runs.retry_run"}

    @extend_schema(request=EmptySerializer, responses={201: s.RunOutSerializer})
    def post(self, request, run_id):
        EmptySerializer(data=request.data if request.data is not None else {}).is_valid(raise_exception=True)
        run = run_retry(run_id=run_id, actor_type=ActorType.API_APP, actor=self.actor, role=self.role)
        return Response(s.RunOutSerializer(_run(run.pk)).data, status=201)
