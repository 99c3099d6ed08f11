from django.urls import path

from . import views

urlpatterns = [
    path("runs/<uuid:run_id>/log", views.RunLogView.as_view(), name="ops-run-log"),
    path("runs/<uuid:run_id>/artifacts", views.RunArtifactListView.as_view(), name="ops-run-artifacts"),
    path(
        "runs/<uuid:run_id>/artifacts/<int:artifact_id>",
        views.ArtifactDownloadView.as_view(),
        name="ops-run-artifact",
    ),
]
