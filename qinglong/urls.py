"""URL map. Worker API: /api/v1/worker/ (signed). Operator API: /api/v1/ops/ (API token or session).
OpenAPI 3 schema: /api/v1/schema (YAML by default, ``?format=json`` for JSON; committed as
docs/openapi.yaml), browsable at /api/v1/docs (Swagger UI, served from the install). Health:
/healthz, /readyz; Prometheus: /metrics (docs/operations.md). Unknown /api/ paths answer the
JSON error body (404 ``not_found``), and so does a request Django refuses before routing
(400 ``host_not_allowed``)."""

from django.contrib import admin
from django.urls import include, path

from api.docs import BrowserSchemaView, DocsView
from api.health import healthz, readyz
from api.metrics import metrics

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/worker/", include("api.workers.urls")),
    path("api/v1/worker/", include("api.leases.urls")),
    path("api/v1/worker/", include("api.logs.urls")),
    path("api/v1/ops/", include("api.runs.urls")),
    path("api/v1/ops/", include("api.placement.urls")),
    path("api/v1/ops/", include("api.fleet.urls")),
    path("api/v1/ops/", include("api.schedules.urls")),
    path("api/v1/ops/", include("api.logs.ops_urls")),
    path("api/v1/schema", BrowserSchemaView.as_view(), name="openapi-schema"),
    path("api/v1/docs", DocsView.as_view(), name="api-docs"),
]

handler400 = "api.exceptions.bad_request"
handler403 = "api.exceptions.permission_denied"
handler404 = "api.exceptions.not_found"
handler500 = "api.exceptions.server_error"
