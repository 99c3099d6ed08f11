"""ASGI entry point (``manage.py serve`` runs it under Granian): Django behind ``RequestGuard``.

Every request but the waiting ones runs Django's WSGI handler on a fixed pool of threads (a2wsgi's
``WSGIMiddleware``), one per request slot; the worker API's requests reach the same threads in one
hop each way (``qinglong.serving.BufferedWSGI``), and a handler without the console's middleware
(``qinglong.handlers.WorkerAPIHandler``). Django's own ASGI handler would run each request's
synchronous code in a thread made for that request (a ``ThreadSensitiveContext`` each): measured
with bench-claim's signed-HTTP loops on 2 cores, the pooled threads serve about 1.5× as many
(docs/performance.md), and a thread keeps its Redis client and cache objects between requests.

The guard enforces the limits the server does not (header count, body size and read deadline,
requests inside Django at once; ``qinglong.serving``), configured by ``settings.QINGLONG_SERVER``.

Waiting requests (``WAITING_PATHS``: the waiting claim, docs/leases.md "Waiting claims") take
another road: ``WaitingHandler``, a Django ASGI handler whose only middleware is the async
access log, so the whole request — and its wait — runs on the event loop. Django's full
middleware chain has synchronous members (whitenoise, the session and message middleware), and
one synchronous member makes Django run the whole request, wait included, in a thread. The
waiting view runs its synchronous services in the bounded pool of ``api.waiting``.

A server process spawned by ``manage.py serve`` dies with it (``exit_with_parent``): a serve
killed with SIGKILL would otherwise leave it serving on the shared port, holding its database
connections, with nobody to stop it.

Once the application is built, every module a request needs is imported (the URLconf and its
views) and what exists then is moved out of the garbage collector's sight (``gc.freeze()``):
otherwise every full collection walks those ~130,000 long-lived objects again, which adds to
the pauses of the event loop — and so to every waiting request's timer — while a thousand waits
are held (docs/deploy.md, "Waiting claims").
"""

import gc
import os

from a2wsgi import WSGIMiddleware
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from protocol import wire
from qinglong.handlers import WorkerAPIHandler
from qinglong.serving import BufferedWSGI, RequestGuard, exit_with_parent

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qinglong.settings")
exit_with_parent()  # a server process of `manage.py serve` never outlives it
#: Every request but the waiting ones: Django's WSGI handler on a fixed pool of threads, as many as
#: the request slots (``RequestGuard`` lets no more in at once). Building it sets Django up: the
#: app modules import after it.
_wsgi = get_wsgi_application()
_pooled = WSGIMiddleware(
    _wsgi,  # type: ignore[arg-type]  # django-stubs types the answer, not an iterable
    workers=settings.QINGLONG_SERVER["MAX_ACTIVE_REQUESTS"],
)
#: The worker API takes the buffered road to the same threads (``qinglong.serving.BufferedWSGI``),
#: through Django's handler without the console's middleware (``qinglong.handlers``).
django_application = BufferedWSGI(
    WorkerAPIHandler(), executor=_pooled.executor, fallback=_pooled, prefixes=(wire.API_PREFIX,)
)

from api.observability import ObservabilityMiddleware  # noqa: E402 - needs the app registry

#: Paths served by ``WaitingHandler``: they hold no request slot while they wait.
WAITING_PATHS = frozenset({wire.CLAIM_WAIT})


class WaitingHandler(ASGIHandler):
    """Django's ASGI handler with one async middleware (the access log) and no per-request thread.

    Django's handler enters a ``ThreadSensitiveContext`` per request, which gives the request a
    thread of its own for as long as it lasts; the waiting views run no thread-sensitive code
    (their services run in ``api.waiting.EXECUTOR``), so that is left out here."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list = []
        self._template_response_middleware: list = []
        self._exception_middleware: list = []
        handler = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]
        self._middleware_chain = convert_exception_to_response(ObservabilityMiddleware(handler))

    async def __call__(self, scope, receive, send):
        await self.handle(scope, receive, send)


waiting_application = WaitingHandler()
application = RequestGuard(
    django_application,
    waiting_app=waiting_application,
    waiting_paths=WAITING_PATHS,
    max_headers=settings.QINGLONG_SERVER["MAX_HEADERS"],
    max_body_bytes=settings.QINGLONG_SERVER["MAX_BODY_BYTES"],
    body_timeout_seconds=settings.QINGLONG_SERVER["BODY_TIMEOUT_SECONDS"],
    max_active=settings.QINGLONG_SERVER["MAX_ACTIVE_REQUESTS"],
)


def freeze_startup_objects() -> None:
    """Import what the first requests would (every view, through the URLconf), collect once, and
    freeze the survivors (``gc.freeze()``): later collections skip them (module docstring)."""
    get_resolver().url_patterns  # noqa: B018 - imports the URLconf and every view module
    gc.collect()
    gc.freeze()


freeze_startup_objects()
