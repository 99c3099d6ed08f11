"""Per-endpoint request body limits, enforced before anything reads or parses the body; requests
whose path or query holds a NUL character, refused before anything queries with it; and the
console's session, user and message middleware, which the worker API never needs."""

from __future__ import annotations

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponseBadRequest, JsonResponse
from django.utils.deprecation import MiddlewareMixin

from api.exceptions import is_api
from api.query import digits_value
from protocol.wire import API_PREFIX


class _NotForWorkers(MiddlewareMixin):
    """Skip this middleware on the worker API (``/api/v1/worker/…``): its requests are
    authenticated by signature only (``api.auth``), never by a console session or user, and they
    carry no messages. It was about 5 % of a heartbeat's CPU (docs/performance.md "Signed HTTP")."""

    def __call__(self, request):
        if request.path_info.startswith(API_PREFIX):
            return self.get_response(request)  # a coroutine in async mode: awaited by the caller
        return super().__call__(request)


class ConsoleSessionMiddleware(_NotForWorkers, SessionMiddleware):
    """Django's ``SessionMiddleware``, except on the worker API."""


class ConsoleAuthenticationMiddleware(_NotForWorkers, AuthenticationMiddleware):
    """Django's ``AuthenticationMiddleware``, except on the worker API."""


class ConsoleMessageMiddleware(_NotForWorkers, MessageMiddleware):
    """Django's ``MessageMiddleware``, except on the worker API."""


class BodyLimitMiddleware:
    """Answer 413 ``body_too_large`` when ``Content-Length`` exceeds the view's ``max_body_bytes``.

    Runs in ``process_view``, i.e. after URL resolution and before authentication (which reads
    the body to check its digest) and before parsing. Views without the attribute (the admin)
    keep Django's own ``DATA_UPLOAD_MAX_MEMORY_SIZE``. A Content-Length that is not a
    non-negative integer is refused (400 ``content_length_invalid``): the size must be known up
    front. Without a Content-Length the WSGI request has an empty body (Django reads nothing),
    so a body cannot slip past the limit by leaving the header out.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        view_class = getattr(view_func, "cls", None) or getattr(view_func, "view_class", None)
        limit = getattr(view_class, "max_body_bytes", None)
        if limit is None:
            return None
        raw_length = request.META.get("CONTENT_LENGTH") or "0"
        length = digits_value(raw_length)
        if length is None:
            return JsonResponse(
                {
                    "code": "content_length_invalid",
                    "message": f"Content-Length {raw_length[:20]!r} is not a non-negative integer",
                    "field": "Content-Length",
                },
                status=400,
            )
        if length > limit:
            return _too_large(f"the body is {length} bytes; this endpoint takes at most {limit}", limit)
        return None


def _too_large(message: str, limit: int) -> JsonResponse:
    return JsonResponse(
        {"code": "body_too_large", "message": message, "field": None, "details": {"limitBytes": limit}},
        status=413,
    )


class NulRefusalMiddleware:
    """Answer 400 when the path or a query parameter (its name or a value) holds a NUL character
    (``%00``): no URL or filter can mean one, and PostgreSQL refuses text holding it outright
    (psycopg's ``DataError``: a 500 wherever it reached a query — an admin search, a list filter,
    an object id in a path). On the API: ``validation_failed`` naming the parameter (or ``path``);
    elsewhere Django's plain 400. Costs a substring test per request; the query is parsed only
    when it holds ``%00``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest):
        field = _nul_field(request)
        if field is None:
            return self.get_response(request)
        if is_api(request):
            return JsonResponse(
                {"code": "validation_failed", "message": "must not contain a NUL character", "field": field},
                status=400,
            )
        return HttpResponseBadRequest(
            "400 Bad Request: a NUL character in the path or query.\n", content_type="text/plain"
        )


def _nul_field(request: HttpRequest) -> str | None:
    """``path``, or the first query parameter whose name or value holds NUL; None if none does."""
    if "\x00" in request.path_info:
        return "path"
    if "%00" not in request.META.get("QUERY_STRING", ""):
        return None
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return name
    return None
