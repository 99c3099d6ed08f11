from django.urls import path

from . import views

urlpatterns = [
    path("workers", views.WorkerListView.as_view(), name="ops-workers"),
    path("workers/<uuid:worker_id>", views.WorkerDetailView.as_view(), name="ops-worker"),
    path(
        "workers/<uuid:worker_id>/enrollment-tokens",
        views.EnrollmentTokenView.as_view(),
        name="ops-worker-enrollment-tokens",
    ),
    path("workers/<uuid:worker_id>/drain", views.WorkerDrainView.as_view(), name="ops-worker-drain"),
    path("workers/<uuid:worker_id>/undrain", views.WorkerUndrainView.as_view(), name="ops-worker-undrain"),
    path("workers/<uuid:worker_id>/revoke", views.WorkerRevokeView.as_view(), name="ops-worker-revoke"),
    path("workers/<uuid:worker_id>/rotate", views.WorkerRotateView.as_view(), name="ops-worker-rotate"),
    path("workers/<uuid:worker_id>/offline", views.WorkerOfflineView.as_view(), name="ops-worker-offline"),
    path("sessions", views.SessionListView.as_view(), name="ops-sessions"),
    path("sessions/<uuid:session_id>", views.SessionDetailView.as_view(), name="ops-session"),
    path("audit", views.AuditListView.as_view(), name="ops-audit"),
]
