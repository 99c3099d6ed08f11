from django.urls import path

from protocol import wire

from . import views, waiting


def _route(full_path: str) -> str:
    return full_path.removeprefix(wire.API_PREFIX)


urlpatterns = [
    path(_route(wire.CLAIM), views.ClaimView.as_view(), name="worker-claim"),
    path(_route(wire.CLAIM_WAIT), waiting.claim_wait, name="worker-claim-wait"),
    path(_route(wire.LEASE_STARTING), views.StartingView.as_view(), name="worker-lease-starting"),
    path(_route(wire.LEASE_RUNNING), views.RunningView.as_view(), name="worker-lease-running"),
    path(_route(wire.LEASE_START_FAILED), views.StartFailedView.as_view(), name="worker-lease-start-failed"),
    path(_route(wire.LEASE_RENEW), views.RenewView.as_view(), name="worker-lease-renew"),
    path(_route(wire.LEASE_RELEASE), views.ReleaseView.as_view(), name="worker-lease-release"),
    path(_route(wire.LEASE_COMPLETE), views.CompleteView.as_view(), name="worker-lease-complete"),
]
