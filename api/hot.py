"""The hot worker endpoints without DRF's dispatch (docs/performance.md, "The hot endpoints").

A worker calls claim, the starting and running ACKs, renewal, completion and heartbeat for every
attempt it runs; DRF's request wrapper, content negotiation, parser selection, permission and
throttle loops around each of those calls were about 8 % of a call's server CPU (in process: a
heartbeat 1.13 → 1.05 ms, a claim 1.16 → 1.07 ms). :func:`hot_endpoint` serves such a view's
ordinary requests itself and hands every other request, untouched, to the view's DRF dispatch:

* ordinary: ``POST``, no query string, ``Content-Type: application/json`` (what the agent sends),
  no ``Accept`` or one DRF would answer with plain ``application/json`` (``*/*``,
  ``application/json``). Anything else — ``OPTIONS``, another method, an ``Accept`` asking for an
  indent or another type, another content type — goes to DRF before anything is read, so it gets
  exactly DRF's answer (405, 406, 415, the OPTIONS metadata).
* the same steps in the same order as ``api.base.WorkerAPIView``: signature authentication,
  nonce and rate counting (``api.auth``, 401 and 429), the per-worker limit and the principal
  binding, which parses the body (``WorkerAPIView.admit``: 429, 400, 403), then the view's own
  ``post`` (validation 400, the write path), and every error through the API's exception handler
  (``api.exceptions``) with DRF's ``Allow`` header and ``WWW-Authenticate`` on a 401.

The answer is the DRF ``Response`` the view returns, finalized as DRF finalizes it (renderer,
media type, renderer context, headers) and rendered by Django's handler: the same bytes, status
and headers as through DRF. The contract tests run through here (the URLs route to it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponseBase
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from api.auth import WorkerSignatureAuthentication
from api.base import IsWorker, WorkerAPIView
from api.exceptions import exception_handler
from api.parsers import StrictJSONParser, parse_body

#: The ``Accept`` values DRF's negotiation answers with ``application/json`` as it is.
_PLAIN_ACCEPT = frozenset({None, "*/*", "application/json"})
_RENDERER = JSONRenderer()
_MEDIA_TYPE = "application/json"
_UNPARSED = object()
#: What DRF's dispatch would run and this road does not (or runs as ``WorkerAPIView`` has it): a
#: view overriding any of them is refused here rather than silently served without it.
_SKIPPED = (
    "dispatch",
    "initialize_request",
    "initial",
    "perform_content_negotiation",
    "perform_authentication",
    "check_permissions",
    "check_throttles",
    "determine_version",
    "get_authenticators",
    "get_permissions",
    "get_throttles",
    "handle_exception",
    "finalize_response",
    "content_negotiation_class",
    "versioning_class",
)


class HotRequest:
    """What a worker view reads of DRF's request: Django's request (``_request``; any other
    attribute is read from it, as DRF's request does), the authenticated principal (``user``,
    ``auth``: the signed request) and the body (``data``, parsed on first use by
    ``api.parsers.parse_body``, as DRF's parser parses it)."""

    def __init__(self, raw: HttpRequest, max_depth: int) -> None:
        self._request = raw
        self._max_depth = max_depth
        self._data: Any = _UNPARSED
        self.user: Any = None
        self.auth: Any = None

    @property
    def data(self) -> Any:
        if self._data is _UNPARSED:
            self._data = parse_body(self._request.body, max_depth=self._max_depth)
        return self._data

    @property
    def query_params(self) -> Any:
        return self._request.GET

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def is_ordinary(raw: HttpRequest) -> bool:
    """True when DRF would take ``raw`` the way :func:`hot_endpoint` does (module docstring)."""
    meta = raw.META
    return (
        raw.method == "POST"
        and not meta.get("QUERY_STRING")
        and meta.get("CONTENT_TYPE") == _MEDIA_TYPE
        and meta.get("HTTP_ACCEPT") in _PLAIN_ACCEPT
    )


def hot_endpoint(view_class: type[WorkerAPIView]) -> Callable[..., HttpResponseBase]:
    """The Django view of ``view_class`` (a ``WorkerAPIView`` with a ``post``) for the URLconf.

    Ordinary requests are served here, others by ``view_class.as_view()`` (module docstring).
    The view keeps DRF's markers (``cls``, ``initkwargs``, CSRF exemption), so the body limit
    (``api.middleware``), the OpenAPI schema and the URL names see the DRF view. Raises only
    what the exception handler does not answer (a bug: Django's 500).
    """
    _check_served_alike(view_class)
    dispatch = view_class.as_view()
    authenticator = WorkerSignatureAuthentication()

    def view(raw: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not is_ordinary(raw):
            return dispatch(raw, *args, **kwargs)
        instance = view_class()
        request = HotRequest(raw, instance.max_json_depth)
        instance.args, instance.kwargs, instance.request = args, kwargs, request  # type: ignore[assignment]
        instance.headers = instance.default_response_headers
        try:
            principal, signed = authenticator.authenticate_raw(raw, instance)
            request.user = raw.user = principal  # type: ignore[assignment]  # DRF sets both
            request.auth = raw.auth = signed  # type: ignore[attr-defined]
            instance.admit(request, kwargs)
            response = instance.post(request, *args, **kwargs)  # type: ignore[attr-defined]
        except Exception as exc:  # what DRF's handle_exception catches, answered alike
            response = exception_handler(exc, instance.get_exception_handler_context())
            if response is None:
                raise
            response.exception = True
        return _finalized(instance, response)

    view.cls = view_class  # type: ignore[attr-defined]
    view.initkwargs = {}  # type: ignore[attr-defined]
    view.csrf_exempt = True  # type: ignore[attr-defined]
    view.__doc__ = view_class.__doc__
    return view


def _check_served_alike(view_class: type[WorkerAPIView]) -> None:
    """Refuse (ImproperlyConfigured, at URLconf import) a view this module would not serve as DRF
    does: it must authenticate, permit, parse and render exactly as ``WorkerAPIView`` (one
    signature authenticator, ``IsWorker``, no throttles, strict JSON in, JSON out), override none
    of the dispatch steps this road skips (``_SKIPPED``) and have a ``post``."""
    expected = {
        "authentication_classes": [WorkerSignatureAuthentication],
        "permission_classes": [IsWorker],
        "throttle_classes": [],
        "parser_classes": [StrictJSONParser],
        "renderer_classes": [JSONRenderer],
    }
    for name, classes in expected.items():
        if list(getattr(view_class, name)) != classes:
            raise ImproperlyConfigured(f"{view_class.__name__}.{name} is not {classes}: serve it through DRF")
    for name in _SKIPPED:
        if getattr(view_class, name) is not getattr(WorkerAPIView, name):
            raise ImproperlyConfigured(
                f"{view_class.__name__} overrides {name}, which this road skips: serve it through DRF"
            )
    if not hasattr(view_class, "post"):
        raise ImproperlyConfigured(f"{view_class.__name__} has no post: nothing to serve")


def _finalized(instance: WorkerAPIView, response: Response) -> Response:
    """DRF's ``finalize_response`` for a request negotiated to plain JSON."""
    response.accepted_renderer = _RENDERER
    response.accepted_media_type = _MEDIA_TYPE
    response.renderer_context = instance.get_renderer_context()  # type: ignore[attr-defined]
    for key, value in instance.headers.items():
        response[key] = value
    return response
