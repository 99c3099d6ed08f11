"""The schema and its browsable documentation: ``/api/v1/schema`` and ``/api/v1/docs``.

``/api/v1/docs`` is drf-spectacular's Swagger UI with its assets from the installed
drf-spectacular-sidecar (``SWAGGER_UI_DIST = "SIDECAR"``), so it loads nothing from the internet.
(Kept apart from ``api.schema``, which DRF imports while drf-spectacular's views load.)
"""

from __future__ import annotations

from drf_spectacular.renderers import (
    OpenApiJsonRenderer,
    OpenApiJsonRenderer2,
    OpenApiYamlRenderer,
    OpenApiYamlRenderer2,
)
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView


class BrowserYamlRenderer(OpenApiYamlRenderer):
    """The YAML schema as ``text/plain``: what a browser shows instead of downloading."""

    media_type = "text/plain"


class BrowserSchemaView(SpectacularAPIView):
    """``/api/v1/schema``: YAML as ``text/plain`` unless the client asks for an OpenAPI media type
    (``application/vnd.oai.openapi``, ``application/yaml``) or JSON (``?format=json``)."""

    renderer_classes = [
        BrowserYamlRenderer,
        OpenApiYamlRenderer,
        OpenApiYamlRenderer2,
        OpenApiJsonRenderer,
        OpenApiJsonRenderer2,
    ]


class DocsView(SpectacularSwaggerView):
    """``/api/v1/docs``: Swagger UI over ``/api/v1/schema``, every asset served by this install."""

    url_name = "openapi-schema"
