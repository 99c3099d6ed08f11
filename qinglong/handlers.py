"""Django's WSGI handler for the worker API's requests in ``manage.py serve`` (qinglong.asgi).

Every signed worker call passed through the whole ``MIDDLEWARE`` list, six of whose twelve
members are the console's (``settings.CONSOLE_ONLY_MIDDLEWARE``: static files, sessions, CSRF,
users, messages, the operator's timezone) and do nothing to a worker request but cost a call or
two each. ``WorkerAPIHandler`` builds its chain from ``settings.WORKER_API_MIDDLEWARE`` — the
same list in the same order without them — so the worker API's answers are the same bytes,
status and headers (tests/qinglong/test_worker_api_handler.py sends the same requests through
both) for about 5 % fewer instructions per call (docs/performance.md, "Where the time goes").
Every other path keeps Django's handler and the whole list.
"""

from __future__ import annotations

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler


class WorkerAPIMiddlewareMixin:
    """For a Django handler class: load ``settings.WORKER_API_MIDDLEWARE`` instead of
    ``MIDDLEWARE``. Only for requests under ``protocol.wire.API_PREFIX``: what it leaves out is
    what the console's pages need."""

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
