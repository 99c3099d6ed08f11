from django.urls import path

from api.hot import hot_endpoint
from protocol import wire

from . import views, waiting


def _route(full_path: str) -> str:
    return full_path.removeprefix(wire.API_PREFIX)


urlpatterns = [
    path(_route(wire.CLAIM), hot_endpoint(views.ClaimView), name="worker-claim"),
    path(_route(wire.CLAIM_WAIT), waiting.claim_wait, name="worker-claim-wait"),
    path(_route(wire.LEASE_STARTING), hot_endpoint(views.StartingView), name="worker-lease-starting"),
    path(_route(wire.LEASE_RUNNING), hot_endpoint(views.RunningView), name="worker-lease-running"),
    path(_route(wire.LEASE_START_FAILED), views.StartFailedView.as_view(), name="worker-lease-start-failed"),
    path(_route(wire.LEASE_RENEW), hot_endpoint(views.RenewView), name="worker-lease-renew"),
    path(_route(wire.LEASE_RELEASE), views.ReleaseView.as_view(), name="worker-lease-release"),
    path(_route(wire.LEASE_COMPLETE), hot_endpoint(views.CompleteView), name="worker-lease-complete"),
]
