"""The schema and its browsable documentation: ``/api/v1/schema`` and ``/api/v1/docs``.

``/api/v1/docs`` is drf-spectacular's Swagger UI with its assets from the installed
drf-spectacular-sidecar (``SWAGGER_UI_DIST = "SIDECAR"``), so it loads nothing from the internet.
(Kept apart from ``api.schema``, which DRF imports while drf-spectacular's views load.)

Their refusals (405, 406, 404 for an unknown ``?format=``) are the API's JSON errors, like every
other answer under ``/api/`` (``JsonRefusals``), not rendered as YAML or HTML; ``OPTIONS`` is not
offered (405): neither renderer has a place for DRF's metadata.
"""

from __future__ import annotations

from drf_spectacular.renderers import (
    OpenApiJsonRenderer,
    OpenApiJsonRenderer2,
    OpenApiYamlRenderer,
    OpenApiYamlRenderer2,
)
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

_JSON = JSONRenderer()


class JsonRefusals(APIView):
    """For a view whose renderers are not JSON: its refusals are rendered as JSON all the same,
    and it answers ``OPTIONS`` 405 (no ``metadata_class``)."""

    metadata_class = None

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if getattr(response, "exception", False):
            response.accepted_renderer = _JSON
            response.accepted_media_type = _JSON.media_type
            response.renderer_context = self.get_renderer_context()
        return response


class BrowserYamlRenderer(OpenApiYamlRenderer):
    """The YAML schema as ``text/plain``: what a browser shows instead of downloading."""

    media_type = "text/plain"


class BrowserSchemaView(JsonRefusals, SpectacularAPIView):
    """``/api/v1/schema``: YAML as ``text/plain`` unless the client asks for an OpenAPI media type
    (``application/vnd.oai.openapi``, ``application/yaml``) or JSON (``?format=json``)."""

    renderer_classes = [
        BrowserYamlRenderer,
        OpenApiYamlRenderer,
        OpenApiYamlRenderer2,
        OpenApiJsonRenderer,
        OpenApiJsonRenderer2,
    ]


class DocsView(JsonRefusals, SpectacularSwaggerView):
    """``/api/v1/docs``: Swagger UI over ``/api/v1/schema``, every asset served by this install."""

    url_name = "openapi-schema"
