from django.urls import path

from api.hot import hot_endpoint
from protocol import wire

from . import views


def _route(full_path: str) -> str:
    return full_path.removeprefix(wire.API_PREFIX)


urlpatterns = [
    path(_route(wire.ENROLL), views.EnrollView.as_view(), name="worker-enroll"),
    path(_route(wire.ROTATE_KEY), views.RotateKeyView.as_view(), name="worker-rotate-key"),
    path(_route(wire.SESSION_REGISTER), views.RegisterView.as_view(), name="worker-session-register"),
    path(_route(wire.SESSION_HEARTBEAT), hot_endpoint(views.HeartbeatView), name="worker-session-heartbeat"),
    path(_route(wire.SESSION_DRAIN), views.DrainView.as_view(), name="worker-session-drain"),
    path(_route(wire.SESSION_OFFLINE), views.OfflineView.as_view(), name="worker-session-offline"),
]
