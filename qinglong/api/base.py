"""Base classes for the two APIs: strict serializers, the worker view, the operator view.

Worker views (``WorkerAPIView``) authenticate only by RFC 9421 signature, are rate limited per
principal, and refuse a body ``workerId`` that differs from the principal *before any repository
access* — the check runs in ``initial()``, right after authentication and before the handler.
Operator views (``OperatorAPIView``) take staff token or session authentication and refuse any
request carrying a worker signature, so a worker credential can never reach them.
"""

from __future__ import annotations

from django_ratelimit.core import get_usage
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, TokenAuthentication
from rest_framework.permissions import BasePermission, IsAdminUser
from rest_framework.views import APIView

from protocol.wire import DEFAULT_BODY_LIMIT
from qinglong.conf import protocol
from qinglong.errors import DomainError
from workers.auth import WorkerPrincipal, WorkerSignatureAuthentication


class StrictSerializer(serializers.Serializer):
    """A serializer that refuses unknown keys (naming the first) instead of ignoring them."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: ["unknown field"]})
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """An integer that must be a JSON integer: no strings, floats or booleans."""

    def to_internal_value(self, data):
        if type(data) is not int:
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A string that must be a JSON string (DRF would otherwise turn numbers into text)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class IsWorker(BasePermission):
    """Only a request authenticated as a worker (``WorkerPrincipal``) passes."""

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, WorkerPrincipal)


class WorkerAPIView(APIView):
    """Base for worker endpoints (ADR-0012 §1): signed, rate limited, principal-bound."""

    authentication_classes = [WorkerSignatureAuthentication]
    permission_classes = [IsWorker]
    max_body_bytes = DEFAULT_BODY_LIMIT
    max_json_depth = 4
    http_method_names = ["post", "options"]

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        principal: WorkerPrincipal = request.user
        usage = get_usage(
            request,
            group="worker-api",
            key=lambda group, req: str(principal.worker_id),
            rate=protocol().rate_worker,
            increment=True,
        )
        if usage and usage["should_limit"]:
            raise DomainError(
                "rate_limited", "too many requests from this worker", retry_after=max(1, usage["time_left"])
            )
        data = request.data
        claimed = data.get("workerId") if isinstance(data, dict) else None
        if claimed is not None and str(claimed) != str(principal.worker_id):
            raise DomainError("principal_mismatch", "workerId is not the authenticated worker", field="workerId")

    @property
    def principal(self) -> WorkerPrincipal:
        return self.request.user


class RefuseWorkerSignature(BaseAuthentication):
    """Operator endpoints: a request signed as a worker is refused outright (403)."""

    def authenticate(self, request):
        if "Signature-Input" in request._request.headers or "Signature" in request._request.headers:
            raise DomainError("worker_credential_forbidden", "worker credentials cannot reach operator endpoints")
        return None


class OperatorAPIView(APIView):
    """Base for operator endpoints: staff users by token (``Authorization: Token …``) or session."""

    authentication_classes = [TokenAuthentication, RefuseWorkerSignature, SessionAuthentication]
    permission_classes = [IsAdminUser]
    max_body_bytes = 96 * 1024
    max_json_depth = 8
