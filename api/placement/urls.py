from django.urls import path

from . import views

urlpatterns = [
    path(
        "revisions/<uuid:revision_id>/placement-preview",
        views.PlacementPreviewView.as_view(),
        name="ops-placement-preview",
    ),
    path("runs/<uuid:run_id>/candidates", views.RunCandidatesView.as_view(), name="ops-run-candidates"),
]
