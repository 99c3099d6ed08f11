"""Times in the operator's timezone: the console's page script stores the browser's IANA zone in
the ``ql_tz`` cookie; this middleware activates it for the request (UTC when absent or unknown).
The worker API is never an operator's: its answers are in UTC whatever cookie a request carries."""

from __future__ import annotations

from urllib.parse import unquote
from zoneinfo import ZoneInfo

from django.utils import timezone

from protocol.wire import API_PREFIX

COOKIE = "ql_tz"


class OperatorTimezoneMiddleware:
    """Activate the timezone named by the ``ql_tz`` cookie for this request, if it is a valid one."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info.startswith(API_PREFIX):
            timezone.deactivate()
            return self.get_response(request)
        zone = _zone(unquote(request.COOKIES.get(COOKIE, "")))
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


def _zone(name: str) -> ZoneInfo | None:
    if not name or len(name) > 64 or ".." in name or name.startswith("/"):
        return None
    try:
        return ZoneInfo(name)
    except (ValueError, KeyError, OSError):  # ZoneInfoNotFoundError is a KeyError
        return None
