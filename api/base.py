"""Base classes for the two APIs: strict serializers, the worker view, the operator view.

Worker views (``WorkerAPIView``) authenticate only by RFC 9421 signature, are rate limited per
principal, and refuse a body or path worker id or session id that belongs to another worker
*before any repository access* (ADR-0012 §1) — the check runs in ``initial()``, right after
authentication and before the handler, on cached facts only when the caches are warm.
Operator views (``OperatorAPIView``) take API token or console session authentication, refuse
any request carrying a worker signature (a worker credential can never reach them), and check
the permission each method names (:class:`OperatorPermission`; ``docs/operators.md``).
"""

from __future__ import annotations

import functools
import re
import uuid
from typing import cast

from django.utils import timezone
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.views import APIView

from accounts.models import ApiToken
from accounts.roles import role_of, token_allows
from api import shapes
from api.auth import WorkerSignatureAuthentication
from api.ratelimit import WORKER_GROUP, enforce
from core.conf import protocol
from core.errors import DomainError
from protocol.wire import DEFAULT_BODY_LIMIT
from workers.principals import WorkerPrincipal, session_owner

#: Where a request may name a worker or a session: body keys and URL keyword arguments.
WORKER_FIELDS = (("body", "workerId"), ("path", "worker_id"))
SESSION_FIELDS = (("body", "sessionId"), ("path", "session_id"))


class StrictSerializer(serializers.Serializer):
    """A serializer that refuses unknown keys (naming the first) instead of ignoring them."""

    #: Read by ``api.schema``: request bodies of this serializer forbid additional properties.
    refuses_unknown_fields = True

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: ["unknown field"]})
        return super().to_internal_value(data)


class EmptySerializer(StrictSerializer):
    """No fields: the act needs none (an empty body or ``{}``; any key is refused by name)."""


class StrictIntegerField(serializers.IntegerField):
    """An integer that must be a JSON integer: no strings, floats or booleans."""

    def to_internal_value(self, data):
        if type(data) is not int:
            self.fail("invalid")
        return super().to_internal_value(data)


shapes.rule(StrictIntegerField)(shapes.integer_check)


class StrictCharField(serializers.CharField):
    """A string that must be a JSON string (DRF would otherwise turn numbers into text), taken as
    sent: surrounding whitespace is not silently trimmed (``"ab\n"`` is not ``"ab"``); a field
    whose format forbids it refuses it by its own validation."""

    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


#: A UUID as the protocol writes it (docs/protocol.md): 8-4-4-4-12 hexadecimal digits.
_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class StrictUUIDField(serializers.UUIDField):
    """A UUID that must be a JSON string in its 36-character form: DRF would turn the number 7
    into UUID(int=7) and take ``{…}``, ``urn:uuid:…`` and 32 bare digits as the same id, so one
    offer id could be spelt four ways."""

    default_error_messages = {
        "invalid": "Must be a UUID as 36 characters: 8-4-4-4-12 hexadecimal digits with hyphens."
    }

    def to_internal_value(self, data):
        if not isinstance(data, str) or _UUID_TEXT.fullmatch(data) is None:
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


shapes.rule(StrictCharField)(shapes.text_check)


@shapes.rule(StrictUUIDField)
def _uuid_rule(field: StrictUUIDField) -> shapes.Check | None:
    return None if field.validators else shapes.uuid_check(_UUID_TEXT)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


@shapes.rule(StrictBooleanField)
def _boolean_rule(field: StrictBooleanField) -> shapes.Check | None:
    if field.validators:
        return None

    def check_boolean(value):
        if type(value) is not bool:
            raise shapes.Defer
        return value

    return check_boolean


@functools.cache
def _shape(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    """One unbound instance per serializer class and process, its fields built once.

    DRF builds a serializer's fields afresh for every instance (a deep copy of the declared
    fields, nested serializers included): on the hot worker endpoints that was about a fifth of a
    request's CPU (docs/performance.md "Signed HTTP"). Validating (``run_validation``) and
    representing (``to_representation``) keep no state on the instance, so one instance serves
    every request and thread.
    """
    return serializer_class()


def validated(serializer_class: type[serializers.Serializer], request) -> dict:
    """Validate ``request.data`` with ``serializer_class``; refuses with 400 naming the field.

    A body the serializer's compiled check vouches for (``api.shapes``) is validated by it: the
    same data as ``is_valid``, in a tenth of the time. Any other body is validated by the class's
    shared instance (:func:`_shape`): the same fields and validators, so the same validated data
    as ``is_valid``. A body that refuses is validated again through a fresh serializer and
    ``is_valid``, which raises exactly the error (detail, first field, message) it always raised.
    """
    data = request.data
    check = shapes.compiled(serializer_class)
    if check is not None:
        try:
            return check(data)
        except shapes.Defer:
            pass
    try:
        return _shape(serializer_class).run_validation(data)
    except serializers.ValidationError:
        pass
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def represented(serializer_class: type[serializers.Serializer], instance) -> dict:
    """``serializer_class(instance).data``, by the class's shared instance (:func:`_shape`):
    the same fields, so the same JSON (times still in the request's active timezone)."""
    return _shape(serializer_class).to_representation(instance)


class IsWorker(BasePermission):
    """Only a request authenticated as a worker (``WorkerPrincipal``) passes."""

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, WorkerPrincipal)


def _as_uuid(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (TypeError, ValueError, AttributeError):
        return None  # not an id at all: the serializer refuses it, naming the field


def _claims(request, kwargs: dict, fields: tuple[tuple[str, str], ...]):
    data = request.data if isinstance(request.data, dict) else {}
    for where, name in fields:
        value = data.get(name) if where == "body" else kwargs.get(name)
        if value is not None:
            yield name, value


def check_principal_binding(principal: WorkerPrincipal, request, kwargs: dict) -> None:
    """Refuse a request naming another worker's id or session (ADR-0012 §1, docs/transport.md §3).

    ``request``: the DRF request (its body is parsed here); ``kwargs``: the URL's keyword
    arguments. A ``workerId``/``worker_id`` that is a UUID other than the principal's, or a
    ``sessionId``/``session_id`` registered by another worker, raises DomainError
    ``principal_mismatch`` (403) naming the field. Runs before the handler touches any
    repository; with warm caches it runs no query at all (``workers.principals.session_owner``).
    Values that are not UUIDs pass through to the serializer, which refuses them by field.
    """
    for name, value in _claims(request, kwargs, WORKER_FIELDS):
        claimed = _as_uuid(value)
        if claimed is not None and claimed != principal.worker_id:
            raise DomainError("principal_mismatch", f"{name} is not the authenticated worker", field=name)
    for name, value in _claims(request, kwargs, SESSION_FIELDS):
        owner = session_owner(value)
        if owner is not None and owner != str(principal.worker_id):
            raise DomainError("principal_mismatch", f"{name} belongs to another worker", field=name)


class WorkerAPIView(APIView):
    """Base for worker endpoints (ADR-0012 §1): signed, rate limited, principal-bound.

    Order of a request: URL → body size (``BodyLimitMiddleware``, 413) → signature, clock
    window, credential, digest, nonce (401) → per-principal rate limit (429) → strict JSON
    parse (400) → principal binding (403) → the handler and its repository access.
    """

    authentication_classes = [WorkerSignatureAuthentication]
    permission_classes = [IsWorker]
    error_table = "worker"  # the error answers api.schema documents
    max_body_bytes = DEFAULT_BODY_LIMIT
    max_json_depth = 4
    http_method_names = ["post", "options"]
    #: The per-worker rate-limit bucket; job output has its own (``rate()``), so a chatty job
    #: cannot starve its worker's renewals and heartbeats.
    rate_group = WORKER_GROUP

    def rate(self) -> str:
        """The per-worker rate of this view's bucket (django-ratelimit syntax)."""
        return protocol().rate_worker

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self.admit(request, kwargs)

    def admit(self, request, kwargs: dict) -> None:
        """What a worker request passes once authenticated, before its handler: the per-worker
        rate limit (429) and the principal binding (403), which parses the body (400, 415).
        ``request``: DRF's request, or ``api.hot``'s (``_request``, ``user``, ``data``);
        ``kwargs``: the URL's keyword arguments."""
        principal = self.principal
        usage = getattr(request._request, "worker_usage", None)  # counted with the nonce (api.auth)
        if usage is not None:
            if usage["count"] > usage["limit"]:
                raise DomainError(
                    "rate_limited",
                    "too many requests from this worker",
                    retry_after=max(1, usage["time_left"]),
                )
        else:
            enforce(
                request,
                group=self.rate_group,
                key=lambda group, req: str(principal.worker_id),
                rate=self.rate(),
                message="too many requests from this worker",
            )
        check_principal_binding(principal, request, kwargs)

    @property
    def principal(self) -> WorkerPrincipal:
        # WorkerSignatureAuthentication sets request.user to the principal; the stubs type
        # request.user as a Django user.
        return cast(WorkerPrincipal, self.request.user)

    def session_fence(self, data: dict) -> dict:
        """The session fence of a validated body as write-path keywords (the worker from the
        principal, never from the body): worker_id, session_id, generation and — when the body
        carries one — expected_version."""
        fence = {
            "worker_id": self.principal.worker_id,
            "session_id": data["sessionId"],
            "generation": data["generation"],
        }
        if "expectedVersion" in data:
            fence["expected_version"] = data["expectedVersion"]
        return fence

    def lease_fence(self, data: dict) -> dict:
        """Both fences of a validated lease call (session, then attempt, lease generation and
        token) as write-path keywords (docs/leases.md)."""
        return {
            **self.session_fence(data),
            "attempt_id": data["attemptId"],
            "lease_generation": data["leaseGeneration"],
            "lease_token": data["leaseToken"],
        }


class RefuseWorkerSignature(BaseAuthentication):
    """Operator endpoints: a request signed as a worker is refused outright (403).

    It is the first authenticator of every operator view, so a worker signature is refused even
    next to a valid staff token: a worker credential never reaches an operator endpoint.
    """

    def authenticate(self, request):
        headers = request._request.headers
        if "Signature-Input" in headers or "Signature" in headers:
            raise DomainError(
                "worker_credential_forbidden", "worker credentials cannot reach operator endpoints"
            )
        return None

    def authenticate_header(self, request) -> str:
        return 'Token realm="qinglong-operator"'


class ApiTokenAuthentication(KnoxTokenAuthentication):
    """``Authorization: Token qlops_…``: django-rest-knox's digest lookup (constant-time compare)
    over ``accounts.ApiToken``. Unlike knox, an expired token is refused without deleting rows
    on a read request; revocation deletes it (``actions.tokens.api_token_revoke``)."""

    def authenticate_credentials(self, token: bytes):
        try:
            token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid token.") from None  # knox would answer a 500
        return super().authenticate_credentials(token)

    def _cleanup_token(self, auth_token) -> bool:
        return auth_token.expiry is not None and auth_token.expiry <= timezone.now()


class OperatorPermission(BasePermission):
    """The permission a view's ``permissions`` names for the request's method (GET also serves
    HEAD and OPTIONS): the user must hold it (a superuser holds all), and a request made with an
    API token only what the token's role grants too. A method the view names no permission for
    is refused: nothing is open by default — unless the view has no handler for it at all, which
    DRF answers 405 (nothing runs). No staff check: roles decide (``accounts.roles``)."""

    message = "permission denied"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if user is None or not user.is_authenticated:
            return False  # DRF answers 401 not_authenticated
        needed = required_permission(view, request.method)
        if needed is None:
            if not _serves(view, request.method):
                return True  # no handler runs: DRF answers 405 method_not_allowed, with Allow
            self.message = f"{request.method} is not permitted here"
            return False
        if not user.is_active or not user.has_perm(needed):
            self.message = f"needs the {needed} permission"
            return False
        if isinstance(request.auth, ApiToken) and not token_allows(request.auth.role, needed):
            self.message = f"needs the {needed} permission, beyond this token's role {request.auth.role}"
            return False
        return True


def _serves(view, method: str) -> bool:
    """Whether ``view`` has a handler for ``method`` (as DRF's dispatch looks one up)."""
    name = method.lower()
    return name in view.http_method_names and hasattr(view, name)


def required_permission(view, method: str) -> str | None:
    """The ``app_label.codename`` a view's ``permissions`` map names for ``method``."""
    permissions: dict[str, str] = getattr(view, "permissions", {})
    if method in ("HEAD", "OPTIONS"):
        method = "GET"
    return permissions.get(method)


class OperatorAPIView(APIView):
    """Base for operator endpoints: users by API token (``Authorization: Token …``) or console
    session; each subclass names the permission of each method in ``permissions``
    (``{"GET": "workers.view_worker", "POST": "workers.drain_worker"}``)."""

    authentication_classes = [RefuseWorkerSignature, ApiTokenAuthentication, SessionAuthentication]
    permission_classes = [OperatorPermission]
    permissions: dict[str, str] = {}
    error_table = "operator"  # the error answers api.schema documents
    max_body_bytes = 96 * 1024
    max_json_depth = 8

    @property
    def actor(self) -> str:
        """The acting user's name, for the audit trail."""
        return self.request.user.get_username()

    @property
    def role(self) -> str:
        """The role the act is audited under (``accounts.roles.role_of``)."""
        token = self.request.auth if isinstance(self.request.auth, ApiToken) else None
        return role_of(self.request.user, token.role if token else None)
