"""Worker management API (``/api/v1/ops/``): the admin's worker acts, with the same permissions
(``docs/operators.md`` Worker management API). Thin: parse, call one action or selector, render."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response

from actions.credentials import credential_force_rotation
from actions.enrollment import enrollment_token_create, worker_create
from actions.sessions.shutdown import session_operator_offline
from actions.workers import worker_drain, worker_revoke, worker_undrain
from api.base import EmptySerializer, OperatorAPIView
from api.pagination import page_of, paginate
from audit.models import Event
from core.db import db_now
from core.errors import DomainError
from leases import fleet
from workers.models import SessionState, WorkerSession, WorkerState

from . import serializers as s

CURSOR = [
    OpenApiParameter("cursor", str, required=False, description="from `next`/`previous` of a page"),
    OpenApiParameter("limit", int, required=False, description="page size, 1-200 (default 50)"),
]


def _with_facts(workers, *, detail: bool = False) -> None:
    now = db_now()
    for worker in workers:
        live = worker.live[0] if worker.live else None
        worker.live_facts = fleet.session_facts(live, now=now, with_capabilities=detail) if live else None
        if detail:
            worker.active_attempts = fleet.active_attempts(worker.pk)


def _detail(worker_id) -> dict:
    worker = fleet.worker(worker_id)
    _with_facts([worker], detail=True)
    return s.WorkerDetailSerializer(worker).data


class WorkerListView(OperatorAPIView):
    """List workers by name, with their live session (GET); create a worker to enroll (POST)."""

    permissions = {"GET": "workers.view_worker", "POST": "workers.add_worker"}

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=WorkerState.values, required=False),
            OpenApiParameter("label", str, required=False, description="KEY=VALUE the live session carries"),
            *CURSOR,
        ],
        responses={200: page_of(s.WorkerOutSerializer)},
        operation_id="ops_workers_list",
    )
    def get(self, request):
        queryset = fleet.workers(
            state=request.query_params.get("state"), label=request.query_params.get("label")
        )
        return paginate(
            request, self, queryset, s.WorkerOutSerializer, ordering=("name",), prepare=_with_facts
        )

    @extend_schema(request=s.WorkerInSerializer, responses={201: s.WorkerDetailSerializer})
    def post(self, request):
        serializer = s.WorkerInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        worker = worker_create(
            name=serializer.validated_data["name"],
            description=serializer.validated_data["description"],
            actor=self.actor,
            role=self.role,
        )
        return Response(_detail(worker.pk), status=201)


class WorkerDetailView(OperatorAPIView):
    """One worker: live session (generation, version, capacity used/max, heartbeat age,
    capabilities, software and protocol version against the policy) and its active attempts."""

    permissions = {"GET": "workers.view_worker"}

    @extend_schema(responses={200: s.WorkerDetailSerializer})
    def get(self, request, worker_id):
        return Response(_detail(worker_id))


class EnrollmentTokenView(OperatorAPIView):
    """Issue a single-use enrollment token for the worker; the token is in this answer only.
    Enrolling with it revokes the worker's current credentials."""

    permissions = {"POST": "workers.issue_enrollment_token"}

    @extend_schema(request=s.EnrollmentTokenInSerializer, responses={201: s.EnrollmentTokenOutSerializer})
    def post(self, request, worker_id):
        serializer = s.EnrollmentTokenInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        issued = enrollment_token_create(
            worker_id=worker_id,
            ttl_seconds=serializer.validated_data.get("ttlSeconds"),
            user=request.user,
            role=self.role,
        )
        server = request.build_absolute_uri("/").rstrip("/")
        body = {
            "token": issued.token,
            "workerId": worker_id,
            "expiresAt": issued.record.expires_at,
            "command": f"qinglong-worker enroll --server {server} --token {issued.token}",
        }
        return Response(
            s.EnrollmentTokenOutSerializer(body).data, status=201, headers={"Cache-Control": "no-store"}
        )


class _WorkerAct(OperatorAPIView):
    """POST with an empty body (or ``{}``): one act on the worker; answers its detail."""

    act: ClassVar[Callable[..., object]]

    @extend_schema(request=EmptySerializer, responses={200: s.WorkerDetailSerializer})
    def post(self, request, worker_id):
        EmptySerializer(data=request.data if request.data is not None else {}).is_valid(raise_exception=True)
        type(self).act(worker_id=worker_id, actor=self.actor, role=self.role)
        return Response(_detail(worker_id))


class WorkerDrainView(_WorkerAct):
    """Drain: no new runs, now and across restarts; running attempts finish."""

    permissions = {"POST": "workers.drain_worker"}
    act = worker_drain


class WorkerUndrainView(_WorkerAct):
    """End an operator drain."""

    permissions = {"POST": "workers.drain_worker"}
    act = worker_undrain


class WorkerRevokeView(_WorkerAct):
    """Revoke for good: credentials die, the live session is fenced, its leases settled."""

    permissions = {"POST": "workers.revoke_worker"}
    act = worker_revoke


class WorkerRotateView(_WorkerAct):
    """Force a key rotation within the grace period (the agent rotates on its next heartbeat)."""

    permissions = {"POST": "workers.rotate_worker_credential"}
    act = credential_force_rotation


class WorkerOfflineView(OperatorAPIView):
    """Take the live session offline; with ``force`` even while it holds run leases (settled:
    started attempts lost and retried per policy)."""

    permissions = {"POST": "workers.force_offline_worker"}

    @extend_schema(request=s.OfflineInSerializer, responses={200: s.WorkerDetailSerializer})
    def post(self, request, worker_id):
        serializer = s.OfflineInSerializer(data=request.data if request.data is not None else {})
        serializer.is_valid(raise_exception=True)
        session_operator_offline(
            worker_id=worker_id, force=serializer.validated_data["force"], actor=self.actor, role=self.role
        )
        return Response(_detail(worker_id))


def _uuid_param(request, name: str):
    value = request.query_params.get(name)
    if value is None:
        return None
    try:
        return s.serializers.UUIDField().to_internal_value(value)
    except s.serializers.ValidationError:
        raise DomainError("validation_failed", "must be a UUID", field=name) from None


class SessionListView(OperatorAPIView):
    """Sessions, newest first, by worker and state."""

    permissions = {"GET": "workers.view_workersession"}

    @extend_schema(
        parameters=[
            OpenApiParameter("worker", str, required=False, description="worker id"),
            OpenApiParameter("state", str, enum=SessionState.values, required=False),
            *CURSOR,
        ],
        responses={200: page_of(s.OperatorSessionSerializer)},
        operation_id="ops_sessions_list",
    )
    def get(self, request):
        queryset: QuerySet[WorkerSession] = WorkerSession.objects.select_related("worker").defer(
            "capabilities"
        )
        worker_id = _uuid_param(request, "worker")
        if worker_id is not None:
            queryset = queryset.filter(worker_id=worker_id)
        state = request.query_params.get("state")
        if state is not None:
            if state not in SessionState.values:
                raise DomainError(
                    "validation_failed", f"must be one of {', '.join(SessionState.values)}", field="state"
                )
            queryset = queryset.filter(state=state)
        return paginate(request, self, queryset, s.OperatorSessionSerializer, ordering=("-registered_at",))


class SessionDetailView(OperatorAPIView):
    """One session with its capability snapshot."""

    permissions = {"GET": "workers.view_workersession"}

    @extend_schema(responses={200: s.OperatorSessionDetailSerializer})
    def get(self, request, session_id):
        session = WorkerSession.objects.select_related("worker").filter(pk=session_id).first()
        if session is None:
            raise DomainError("session_unknown", "no such session")
        facts = fleet.session_facts(session, now=db_now(), with_capabilities=True)
        return Response(
            s.OperatorSessionDetailSerializer(session, context={"capabilities": facts.capabilities}).data
        )


class AuditListView(OperatorAPIView):
    """The audit log, newest first: filter by target (worker, session, run), actor, action
    (event kind, or a prefix ending in ``.``) and time (``since``/``until``, ISO 8601)."""

    permissions = {"GET": "audit.view_event"}

    @extend_schema(
        parameters=[
            OpenApiParameter("worker", str, required=False, description="worker id"),
            OpenApiParameter("session", str, required=False, description="session id"),
            OpenApiParameter("run", str, required=False, description="run id"),
            OpenApiParameter("actor", str, required=False, description="who acted (a username, a worker)"),
            OpenApiParameter(
                "action", str, required=False, description="event kind, or a prefix like `worker.`"
            ),
            OpenApiParameter("since", str, required=False, description="ISO 8601, inclusive"),
            OpenApiParameter("until", str, required=False, description="ISO 8601, exclusive"),
            *CURSOR,
        ],
        responses={200: page_of(s.EventOutSerializer)},
        operation_id="ops_audit_list",
    )
    def get(self, request):
        queryset = Event.objects.all()
        for name, column in (("worker", "worker_id"), ("session", "session_id"), ("run", "run_id")):
            value = _uuid_param(request, name)
            if value is not None:
                queryset = queryset.filter(**{column: value})
        actor = request.query_params.get("actor")
        if actor is not None:
            queryset = queryset.filter(actor=actor[:150])
        action = request.query_params.get("action")
        if action is not None:
            if len(action) > 48:
                raise DomainError("validation_failed", "at most 48 characters", field="action")
            queryset = (
                queryset.filter(kind__startswith=action)
                if action.endswith(".")
                else queryset.filter(kind=action)
            )
        for name, lookup in (("since", "created_at__gte"), ("until", "created_at__lt")):
            value = request.query_params.get(name)
            if value is not None:
                try:
                    moment = s.serializers.DateTimeField().to_internal_value(value)
                except s.serializers.ValidationError:
                    raise DomainError("validation_failed", "must be an ISO 8601 time", field=name) from None
                queryset = queryset.filter(**{lookup: moment})
        return paginate(request, self, queryset, s.EventOutSerializer, ordering=("-id",))
