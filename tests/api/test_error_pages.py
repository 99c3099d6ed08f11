"""An API client never gets an HTML page: a fault of the control plane's own (an exception no
handler expected) answers 500 ``internal_error`` as JSON, and Django's ``PermissionDenied`` and
``Http404`` answer ``permission_denied`` and ``not_found`` as JSON — raised in a DRF view, in a
plain view, or in a hot worker endpoint. The console keeps Django's pages. ``api.exceptions``.

This module is also the URLconf of its tests (``pytest.mark.urls``): the project's routes plus a
few views that fail on purpose, under ``/api/`` and outside it."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.test import Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.views import APIView

from api.exceptions import is_api
from protocol import wire
from protocol.errors import CATALOGUE
from qinglong import urls as project_urls
from tests.helpers import SignedClient, enrolled_worker, heartbeat, register


class Fault(Exception):
    """A fault no handler expects (a bug)."""


def _plain_fault(request):
    raise Fault("a bug in a plain view")


def _plain_denied(request):
    raise PermissionDenied("not for you")


class _OpenView(APIView):
    """A DRF view anyone may call (these tests are about the answer, not who asks)."""

    permission_classes = [AllowAny]
    authentication_classes: list = []


class _DrfFaultView(_OpenView):
    def get(self, request):
        raise Fault("a bug in a DRF view")


class _DrfDeniedView(_OpenView):
    def get(self, request):
        raise PermissionDenied("needs runs.cancel")


class _DrfMissingView(_OpenView):
    def get(self, request):
        raise Http404("no such thing")


urlpatterns = [
    path("api/v1/ops/_test/plain-fault", _plain_fault),
    path("api/v1/ops/_test/plain-denied", _plain_denied),
    path("api/v1/ops/_test/drf-fault", _DrfFaultView.as_view()),
    path("api/v1/ops/_test/drf-denied", _DrfDeniedView.as_view()),
    path("api/v1/ops/_test/drf-missing", _DrfMissingView.as_view()),
    path("console/_test/plain-fault", _plain_fault),
    path("console/_test/plain-denied", _plain_denied),
    *project_urls.urlpatterns,
]
handler400 = project_urls.handler400
handler403 = project_urls.handler403
handler404 = project_urls.handler404
handler500 = project_urls.handler500

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


@pytest.fixture
def answering_client() -> Client:
    """Django's test client that hands back the 500 answer instead of re-raising the fault."""
    return Client(raise_request_exception=False)


def _json_error(answer, status: int, code: str) -> dict:
    assert answer.status_code == status, answer.content[:300]
    assert answer["Content-Type"] == "application/json", answer["Content-Type"]
    body = answer.json()
    assert body["code"] == code and body["field"] is None, body
    assert set(body) == {"code", "message", "field"}
    return body


@pytest.mark.parametrize("route", ["plain-fault", "drf-fault"])
def test_a_fault_on_the_api_answers_internal_error_as_json(answering_client, route, caplog):
    answer = answering_client.get(f"/api/v1/ops/_test/{route}")
    body = _json_error(answer, 500, "internal_error")
    assert body["message"] == CATALOGUE["internal_error"].meaning
    assert "a bug" not in answer.content.decode()  # the fault's text stays in the log
    assert answer["X-Request-ID"]  # the id the log line carries
    assert any(record.exc_info and record.exc_info[0] is Fault for record in caplog.records)


def test_a_fault_in_a_hot_worker_endpoint_answers_internal_error_as_json(answering_client, monkeypatch):
    worker = enrolled_worker()
    session = register(worker)

    def fault(**kwargs):
        raise Fault("the heartbeat path broke")

    monkeypatch.setattr("api.workers.views.session_heartbeat", fault)
    answer = SignedClient(answering_client, worker).post(wire.SESSION_HEARTBEAT, heartbeat(session))
    _json_error(answer, 500, "internal_error")


@pytest.mark.parametrize(
    ("route", "message"), [("plain-denied", "not for you"), ("drf-denied", "needs runs.cancel")]
)
def test_permission_denied_on_the_api_answers_json(answering_client, route, message):
    answer = answering_client.get(f"/api/v1/ops/_test/{route}")
    assert _json_error(answer, 403, "permission_denied")["message"] == message


def test_http404_in_a_drf_view_answers_not_found_as_json(answering_client):
    _json_error(answering_client.get("/api/v1/ops/_test/drf-missing"), 404, "not_found")


def test_the_console_keeps_djangos_pages(answering_client):
    fault = answering_client.get("/console/_test/plain-fault")
    assert fault.status_code == 500 and fault["Content-Type"].startswith("text/html")
    denied = answering_client.get("/console/_test/plain-denied")
    assert denied.status_code == 403 and denied["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("method", "route", "headers", "status", "code"),
    [
        ("post", "/api/v1/docs", {}, 405, "method_not_allowed"),
        ("options", "/api/v1/docs", {}, 405, "method_not_allowed"),
        ("get", "/api/v1/docs", {"Accept": "application/json"}, 406, "not_acceptable"),
        ("get", "/api/v1/docs?format=json", {}, 404, "not_found"),
        ("post", "/api/v1/schema", {}, 405, "method_not_allowed"),
        ("options", "/api/v1/schema", {}, 405, "method_not_allowed"),
        ("get", "/api/v1/schema", {"Accept": "application/xml"}, 406, "not_acceptable"),
        ("get", "/api/v1/schema?format=xml", {}, 404, "not_found"),
    ],
)
def test_the_schema_and_docs_refuse_in_json(answering_client, method, route, headers, status, code):
    """Their answers are YAML and HTML; their refusals are the API's JSON errors all the same."""
    answer = getattr(answering_client, method)(route, headers=headers)
    assert answer.status_code == status, answer.content[:200]
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["code"] == code


def test_the_schema_and_docs_still_answer_yaml_and_html(answering_client):
    schema = answering_client.get("/api/v1/schema")
    assert schema.status_code == 200 and schema["Content-Type"].startswith("text/plain")
    docs = answering_client.get("/api/v1/docs")
    assert docs.status_code == 200 and docs["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("route", ["/api", "/api?x=1"])
def test_the_api_root_without_its_slash_is_still_the_api(answering_client, route):
    _json_error(answering_client.get(route), 404, "not_found")
    assert answering_client.head(route)["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/api", True),
        ("/api/", True),
        ("//api/v1/ops/workers", True),  # what a server hands over for GET //api/…
        ("/api/v1/worker/claim", True),
        ("/apix", False),
        ("/console/api/", False),
        ("/", False),
    ],
)
def test_which_paths_are_the_apis(rf, path, api):
    request = rf.get("/")
    request.path = path
    assert is_api(request) is api


@pytest.mark.parametrize(
    ("route", "field"),
    [
        ("/api/v1/ops/workers?label=zone%3D%00", "label"),
        ("/api/v1/ops/runs?x%00=1", "x\x00"),
        ("/api/v1/ops/workers/%00", "path"),
        ("/api/v1/worker/claim?q=%00", "q"),
    ],
)
def test_a_nul_in_the_path_or_query_is_refused_on_the_api_naming_it(answering_client, route, field):
    """PostgreSQL refuses text holding NUL (psycopg's DataError, a 500 wherever it reached a
    query): ``api.middleware.NulRefusalMiddleware`` refuses it first, on both stores."""
    body = answering_client.get(route)
    assert (body.status_code, body.json()["code"], body.json()["field"]) == (400, "validation_failed", field)


@pytest.mark.parametrize("route", ["/console/?q=%00", "/console/workers/worker/?q=a%00b", "/console/%00/"])
def test_a_nul_in_the_path_or_query_is_a_plain_400_in_the_console(answering_client, route):
    answer = answering_client.get(route)
    assert answer.status_code == 400 and answer["Content-Type"].startswith("text/plain"), answer.content[:200]
