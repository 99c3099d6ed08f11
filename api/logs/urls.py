from django.urls import path

from protocol import wire

from . import views


def _route(full_path: str) -> str:
    return full_path.removeprefix(wire.API_PREFIX)


urlpatterns = [
    path(_route(wire.LOG_APPEND), views.LogAppendView.as_view(), name="worker-lease-log"),
    path(_route(wire.ARTIFACT_UPLOAD), views.ArtifactUploadView.as_view(), name="worker-lease-artifact"),
]
