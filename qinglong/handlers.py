"""Django's WSGI handler for the worker API's requests in ``manage.py serve`` (qinglong.asgi).

Every signed worker call passed through the whole ``MIDDLEWARE`` list, six of whose twelve
members are the console's (``settings.CONSOLE_ONLY_MIDDLEWARE``: static files, sessions, CSRF,
users, messages, the operator's timezone) and do nothing to a worker request but cost a call or
two each. ``WorkerAPIHandler`` builds its chain from ``settings.WORKER_API_MIDDLEWARE`` — the
same list in the same order without them — so the worker API's answers are the same bytes,
status and headers (tests/qinglong/test_worker_api_handler.py sends the same requests through
both) for about 5 % fewer instructions per call (docs/performance.md, "Where the time goes").
Every other path keeps Django's handler and the whole list.

It also keeps the URL resolver's match for each worker path it has resolved: the worker API's
paths are a few fixed strings, and resolving one walked the root URLconf and three includes for
25–35 µs a call. A kept match is Django's own ``ResolverMatch`` for that path under that
resolver (a changed ``ROOT_URLCONF`` has another); paths with URL arguments, and paths that
match nothing, are resolved every time.
"""

from __future__ import annotations

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest
from django.urls import ResolverMatch, get_resolver

#: At most this many paths' matches are kept per handler (the worker API has about twenty).
KEPT_MATCHES = 64


class WorkerAPIMiddlewareMixin:
    """For a Django handler class: load ``settings.WORKER_API_MIDDLEWARE`` instead of
    ``MIDDLEWARE``, and keep each worker path's URL match (module docstring). Only for requests
    under ``protocol.wire.API_PREFIX``: what it leaves out is what the console's pages need."""

    _matches: dict[tuple[object, str], ResolverMatch]

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        """Django's ``BaseHandler.resolve_request``, answered from the kept matches when the
        request's path was resolved before under the same resolver. Raises ``Resolver404`` as
        Django's does."""
        if hasattr(request, "urlconf"):  # a middleware chose another URLconf: Django's way
            return super().resolve_request(request)  # type: ignore[misc]
        matches = self.__dict__.setdefault("_matches", {})
        resolver = get_resolver()
        key = (resolver, request.path_info)
        match = matches.get(key)
        if match is None:
            match = resolver.resolve(request.path_info)
            if not match.args and not match.kwargs and len(matches) < KEPT_MATCHES:
                matches[key] = match
        request.resolver_match = match
        return match

    def load_middleware(self, is_async: bool = False) -> None:
        """Django's own loading (``BaseHandler.load_middleware``, which reads ``MIDDLEWARE`` from
        the settings) of the worker API's list: the setting is swapped for the call, made at
        start-up, when nothing else reads it."""
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.WORKER_API_MIDDLEWARE
        try:
            super().load_middleware(is_async)  # type: ignore[misc]
        finally:
            settings.MIDDLEWARE = full


class WorkerAPIHandler(WorkerAPIMiddlewareMixin, WSGIHandler):
    """Django's ``WSGIHandler`` with the worker API's middleware (module docstring)."""
