"""Worker session endpoints (``/api/v1/worker/…``): thin adapters from wire to services."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from actions.credentials import credential_rotate
from actions.enrollment import worker_enroll
from actions.sessions.heartbeat import session_heartbeat
from actions.sessions.registration import session_register
from actions.sessions.shutdown import session_drain, session_offline
from api.base import WorkerAPIView, validated
from api.ratelimit import by_address, client_address, enforce
from core.conf import protocol
from protocol import wire
from workers.principals import remember_session_owner

from . import serializers as s


class EnrollView(APIView):
    """Exchange a single-use enrollment token and a locally generated public key for a credential."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    error_table = "enroll"  # the error answers api.schema documents
    max_body_bytes = wire.DEFAULT_BODY_LIMIT
    max_json_depth = 2
    http_method_names = ["post", "options"]

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        enforce(
            request,
            group="worker-enroll",
            key=by_address,
            rate=protocol().rate_enroll,
            message="too many enrollment attempts from this address",
        )

    @extend_schema(request=s.EnrollSerializer, responses={201: s.EnrollOutSerializer}, auth=[])
    def post(self, request):
        data = validated(s.EnrollSerializer, request)
        credential = worker_enroll(
            token=data["token"],
            public_key=data["publicKey"],
            worker_name=data.get("workerName"),
            client=client_address(request),
        )
        out = {
            "workerId": credential.worker_id,
            "workerName": credential.worker.name,
            "credentialId": credential.pk,
        }
        return Response(s.EnrollOutSerializer(out).data, status=201)


class RotateKeyView(WorkerAPIView):
    """Rotate the worker's key: signed by the current key, which keeps working only for a short
    grace period (ROTATION_GRACE_SECONDS). 201 for a new rotation, 200 for an exact replay."""

    @extend_schema(
        request=s.RotateSerializer, responses={200: s.RotateOutSerializer, 201: s.RotateOutSerializer}
    )
    def post(self, request):
        data = validated(s.RotateSerializer, request)
        rotation = credential_rotate(
            worker_id=self.principal.worker_id,
            credential_id=self.principal.credential_id,
            public_key=data["publicKey"],
        )
        out = {
            "credentialId": rotation.credential.pk,
            "previousCredentialValidUntil": rotation.previous_valid_until,
        }
        return Response(s.RotateOutSerializer(out).data, status=200 if rotation.replayed else 201)


class RegisterView(WorkerAPIView):
    """Register this process start as a new session (replacing the live one), or replay it."""

    max_body_bytes = wire.BODY_LIMITS[wire.SESSION_REGISTER]
    max_json_depth = 5

    @extend_schema(
        request=s.RegisterSerializer, responses={200: s.SessionOutSerializer, 201: s.SessionOutSerializer}
    )
    def post(self, request):
        data = validated(s.RegisterSerializer, request)
        view = session_register(
            worker_id=self.principal.worker_id,
            session_id=data["sessionId"],
            capabilities=data["capabilities"],
            max_concurrent_runs=data["maxConcurrentRuns"],
            available_slots=data["availableSlots"],
            software_version=data["softwareVersion"],
            protocol_version=data["protocolVersion"],
        )
        # The registration committed: later requests naming this session are bound to its
        # worker from the cache, before any repository access (api.base).
        remember_session_owner(view.session.pk, view.session.worker_id)
        return Response(s.session_out(view), status=200 if view.replayed else 201)


class HeartbeatView(WorkerAPIView):
    """Heartbeat: keep the session lease, report free slots; learn of cancellations and drains."""

    @extend_schema(request=s.HeartbeatSerializer, responses={200: s.SessionOutSerializer})
    def post(self, request):
        data = validated(s.HeartbeatSerializer, request)
        view = session_heartbeat(**self.session_fence(data), available_slots=data["availableSlots"])
        return Response(s.session_out(view))


class DrainView(WorkerAPIView):
    """Enter draining: capacity zero at once, heartbeats still valid, no new claims."""

    @extend_schema(request=s.TransitionSerializer, responses={200: s.SessionOutSerializer})
    def post(self, request):
        data = validated(s.TransitionSerializer, request)
        view = session_drain(**self.session_fence(data))
        return Response(s.session_out(view))


class OfflineView(WorkerAPIView):
    """End the session; refused while it still holds active run leases."""

    @extend_schema(request=s.TransitionSerializer, responses={200: s.SessionOutSerializer})
    def post(self, request):
        data = validated(s.TransitionSerializer, request)
        view = session_offline(**self.session_fence(data), actor=self.principal.worker_name)
        return Response(s.session_out(view))
