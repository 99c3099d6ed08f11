"""The one place errors become HTTP: ``{"code", "message", "field"}`` with a catalogued status.

Domain errors (``core.errors.DomainError``) and protocol errors (``protocol.errors``) carry
their code; DRF's own exceptions are mapped onto catalogue codes; a serializer's errors become
``validation_failed`` naming the first offending field as a path (``offers[0].leaseToken``).
An unreachable dependency (database, Redis) is a catalogued 503 with ``Retry-After``
(``core.dependencies``), here for DRF views and in :func:`server_error` for everything Django runs
before or around them (middleware, the session and authentication path, the admin): one warning
line per change of the dependency's state, no traceback per request.
Anything else is a bug: Django logs it and :func:`server_error` answers 500 ``internal_error``
(JSON on the API, Django's page elsewhere), never dressed up as a 4xx. Django's own
``PermissionDenied`` and ``Http404`` are answered as DRF answers them, ``permission_denied`` and
``not_found``, in DRF views and (:func:`permission_denied`, :func:`not_found`) everywhere else on
the API: an API client never gets an HTML page.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.exceptions import DisallowedHost
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions as drf
from rest_framework.response import Response

from core.dependencies import dependency_error
from core.errors import CATALOGUE, DomainError
from protocol.errors import ProtocolError

log = logging.getLogger("api")

_DRF_CODES: list[tuple[type[drf.APIException], str]] = [
    (drf.NotAuthenticated, "not_authenticated"),
    (drf.AuthenticationFailed, "not_authenticated"),
    (drf.PermissionDenied, "permission_denied"),
    (drf.NotFound, "not_found"),
    (drf.MethodNotAllowed, "method_not_allowed"),
    (drf.UnsupportedMediaType, "unsupported_media_type"),
    (drf.NotAcceptable, "not_acceptable"),
    (drf.ParseError, "json_malformed"),
    (drf.Throttled, "rate_limited"),
]


def first_error(detail: Any, path: str = "") -> tuple[str, str]:
    """Walk DRF's nested error detail to the first leaf: (field path, message).

    Paths use the protocol's spelling: ``offers[0].leaseToken``, ``retry.retryOn[1]`` (DRF keys
    list items by integer in some errors and by position in others; both become ``[i]``).
    """
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key in ("non_field_errors", "__all__"):
                return first_error(value, path)
            if isinstance(key, int):
                return first_error(value, f"{path}[{key}]")
            child = f"{path}.{key}" if path else str(key)
            return first_error(value, child)
        return path, "invalid"
    if isinstance(detail, list):
        for index, value in enumerate(detail):
            if isinstance(value, dict | list) and value:
                return first_error(value, f"{path}[{index}]")
            if not isinstance(value, dict | list):
                return path, str(value)
        return path, "invalid"
    return path, str(detail)


def _response(
    code: str, message: str, field: str | None, *, details: dict | None = None, retry_after: int | None = None
) -> Response:
    body: dict[str, Any] = {"code": code, "message": message, "field": field or None}
    if details:
        body["details"] = details
    response = Response(body, status=CATALOGUE[code].status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


#: The request header a DRF refusal is about, where it names one.
_DRF_FIELDS = {"not_acceptable": "Accept"}

#: Codes whose cause is logged once per outage by ``core.dependencies``, not once per request.
_DEPENDENCY_CODES = ("database_unavailable", "statement_timeout", "cache_unavailable")


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF ``EXCEPTION_HANDLER``: map every expected error to a catalogued JSON answer."""
    response = _handle(exc)
    if response is not None and response.status_code >= 500:
        # A catalogued 503 is an expected, retryable refusal, not a bug: not Django's ERROR for a
        # 5xx, but contention (storage busy, lock timeout) is worth a warning. An unreachable
        # dependency already logged its one line (core.dependencies), not one per request.
        request = context.get("request")
        if response.data["code"] not in _DEPENDENCY_CODES:
            log.log(
                logging.WARNING,
                "%s %s: %s %s",
                getattr(request, "path", "?"),
                response.status_code,
                response.data["code"],
                response.data["message"],
            )
        # django.utils.log.log_response's private marker (not in django-stubs): do not log it again
        response._has_been_logged = True  # type: ignore[attr-defined]
    if response is not None and response.status_code == 401:
        view, request = context.get("view"), context.get("request")
        header = view.get_authenticate_header(request) if view is not None and request is not None else None
        if header:
            response["WWW-Authenticate"] = header
    return response


def _handle(exc: Exception) -> Response | None:
    if isinstance(exc, Http404):  # as DRF's own handler takes Django's two
        exc = drf.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied(str(exc) or drf.PermissionDenied.default_detail)
    outage = dependency_error(exc) if not isinstance(exc, DomainError | ProtocolError) else None
    if outage is not None:
        return _response(outage.code, outage.message, None, retry_after=outage.retry_after)
    if isinstance(exc, DomainError):
        return _response(exc.code, exc.message, exc.field, details=exc.details, retry_after=exc.retry_after)
    if isinstance(exc, ProtocolError):
        return _response(exc.code, exc.message, exc.field)
    if isinstance(exc, drf.ValidationError):
        field, message = first_error(exc.detail)
        # An error about the document itself (a list where an object belongs) names the body.
        return _response("validation_failed", message, field or "body")
    if isinstance(exc, drf.APIException):
        for exc_type, code in _DRF_CODES:
            if isinstance(exc, exc_type):
                retry = getattr(exc, "wait", None)
                retry_after = int(retry) + 1 if retry else None
                return _response(code, str(exc.detail), _DRF_FIELDS.get(code), retry_after=retry_after)
        return Response(
            {"code": "validation_failed", "message": str(exc.detail), "field": None}, status=exc.status_code
        )
    return None


def is_api(request: HttpRequest) -> bool:
    """True for a path of the APIs, whose every answer is JSON: ``/api`` and anything below it,
    however many slashes lead (``//api/v1/…`` resolves nowhere, but is still asked of the API)."""
    head = request.path.lstrip("/")
    return head == "api" or head.startswith("api/")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler404``: API clients get the JSON error body; the admin keeps Django's page."""
    if is_api(request):
        return JsonResponse({"code": "not_found", "message": "no such endpoint", "field": None}, status=404)
    return defaults.page_not_found(request, exception)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler403``: a Django ``PermissionDenied`` raised outside DRF's handler (a middleware, a
    plain view). API clients get ``permission_denied`` as JSON, with the exception's text when it
    has one; the admin keeps Django's page."""
    if is_api(request):
        message = str(exception or "") or str(drf.PermissionDenied.default_detail)
        return JsonResponse({"code": "permission_denied", "message": message, "field": None}, status=403)
    return defaults.permission_denied(request, exception)  # type: ignore[arg-type]


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler400``: what Django refuses before any view runs (a ``Host`` header outside
    ``ALLOWED_HOSTS``, another ``SuspiciousOperation``). API clients get the JSON error body
    (``host_not_allowed`` naming ``Host``, or ``request_rejected``); the admin keeps Django's page."""
    if isinstance(exception, DisallowedHost):
        log.warning("refused a request for %s: %s", request.path, exception)  # one line (see LOGGING)
        code, field = "host_not_allowed", "Host"
    else:
        code, field = "request_rejected", None
    if not is_api(request):
        return defaults.bad_request(request, exception)
    return JsonResponse({"code": code, "message": CATALOGUE[code].meaning, "field": field}, status=400)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: what escaped every view and middleware.

    An unreachable dependency (``core.dependencies``) — raised, say, by the session middleware
    or the authentication path before DRF's handler could see it — answers 503 with its code and
    ``Retry-After``: JSON on the API, a plain-text page for the admin and everything else; it is
    not logged again (one line per dependency state change). Anything else is a bug and stays a
    500 with Django's log line (its traceback): on the API the catalogued ``internal_error`` as
    JSON (the agent retries it), elsewhere Django's page.
    """
    exc = sys.exc_info()[1]
    outage = dependency_error(exc) if exc is not None else None
    if outage is None:
        if is_api(request):
            return JsonResponse(
                {"code": "internal_error", "message": CATALOGUE["internal_error"].meaning, "field": None},
                status=500,
            )
        return defaults.server_error(request)
    response: HttpResponse
    if is_api(request):
        response = JsonResponse({"code": outage.code, "message": outage.message, "field": None}, status=503)
    else:
        response = HttpResponse(
            f"503 Service Unavailable: {outage.message} ({outage.code}).\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
    response["Retry-After"] = str(outage.retry_after)
    # django.utils.log.log_response's private marker (not in django-stubs): no traceback per request
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
