"""Request id, access log and request metrics: one middleware, outermost in ``MIDDLEWARE``.

Every request gets an id — the client's ``X-Request-ID`` when it is a short token
(``[A-Za-z0-9._-]``, at most 64 characters), otherwise a fresh one — answered in the
``X-Request-ID`` response header and attached to every log line written while the request runs
(``RequestIdFilter``, installed on the log handler by settings). After the response, one line on
the ``qinglong.access`` logger: method, path, status, duration, the worker or operator, request
id; and the request counters and latency histogram of ``core.metrics``, labelled by route pattern
(never the raw path: bounded label values). Worker protocol calls also count by outcome code.
docs/operations.md.
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from core.metrics import HTTP_LATENCY, HTTP_REQUESTS, WORKER_CALLS

access_log = logging.getLogger("qinglong.access")

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

#: URL names of the worker API → the call label of ``qinglong_worker_calls_total``.
_WORKER_CALL_PREFIXES = ("worker-session-", "worker-lease-", "worker-")
#: A waiting claim is a claim (offered or empty); ``qinglong_waiting_claims`` counts those held.
_CALL_ALIASES = {"claim-wait": "claim"}


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (``-`` outside a request) to every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


def _request_id(request: HttpRequest) -> str:
    given = request.headers.get(REQUEST_ID_HEADER, "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


def _principal(request: HttpRequest) -> tuple[str, str]:
    """(worker name, operator username) behind the request, ``-`` for none."""
    user = request.__dict__.get("user")  # never evaluate the lazy session user just to log it
    if user is None:
        return "-", "-"
    name = getattr(user, "worker_name", None)
    if name:
        return name, "-"
    if getattr(user, "is_authenticated", False):
        return "-", user.get_username()
    return "-", "-"


def _claim_outcome(answer: dict) -> str:
    """A claim's answered outcome: ``offered`` or ``empty``."""
    return "offered" if answer.get("offers") else "empty"


def _worker_outcome(response: HttpResponse, call: str) -> str:
    data = getattr(response, "data", None)
    if response.status_code >= 400:
        code = data.get("code") if isinstance(data, dict) else None
        return str(code or response.status_code)
    if call == "claim" and isinstance(data, dict):
        return _claim_outcome(data)
    return "ok"


def _next_claim_outcome(response: HttpResponse) -> str | None:
    """A completion's next claim (docs/leases.md, "The next claim") counted as the claim it is:
    ``offered``, ``empty`` or the code it was refused with; None when the completion carried none."""
    data = getattr(response, "data", None)
    if response.status_code >= 400 or not isinstance(data, dict) or "next" not in data:
        return None
    next_claim = data["next"]
    if "refused" in next_claim:
        return str(next_claim["refused"]["code"])
    return _claim_outcome(next_claim)


class ObservabilityMiddleware:
    """Sync and async: the waiting endpoints' handler (``qinglong.asgi``) runs it on the event loop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.async_mode:
            return self._acall(request)
        return self._call(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        request_id = _request_id(request)
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        try:
            response = await self.get_response(request)
            seconds = time.perf_counter() - started
            response[REQUEST_ID_HEADER] = request_id
            self._record(request, response, seconds, request_id)
            return response
        finally:
            request_id_var.reset(token)

    def _call(self, request: HttpRequest) -> HttpResponse:
        request_id = _request_id(request)
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            seconds = time.perf_counter() - started
            response[REQUEST_ID_HEADER] = request_id
            self._record(request, response, seconds, request_id)
            return response
        finally:
            request_id_var.reset(token)

    def _record(self, request: HttpRequest, response: HttpResponse, seconds: float, request_id: str) -> None:
        match = request.resolver_match
        endpoint = "/" + match.route if match is not None else "unmatched"
        status = response.status_code
        HTTP_REQUESTS.labels(endpoint=endpoint, method=request.method, status=str(status)).inc()
        HTTP_LATENCY.labels(endpoint=endpoint).observe(seconds)
        url_name = match.url_name if match is not None else None
        if url_name and url_name.startswith("worker-"):
            call = url_name
            for prefix in _WORKER_CALL_PREFIXES:
                call = call.removeprefix(prefix)
            call = _CALL_ALIASES.get(call, call)
            WORKER_CALLS.labels(call=call, outcome=_worker_outcome(response, call)).inc()
            if call == "complete" and (next_claim := _next_claim_outcome(response)) is not None:
                WORKER_CALLS.labels(call="claim", outcome=next_claim).inc()
        worker, user = _principal(request)
        access_log.info(
            "%s %s %s %.1fms worker=%s user=%s request_id=%s",
            request.method,
            request.path,
            status,
            seconds * 1000,
            worker,
            user,
            request_id,
            extra={
                "method": request.method,
                "path": request.path,
                "status": status,
                "duration_ms": round(seconds * 1000, 2),
                "worker": worker,
                "user": user,
            },
        )
