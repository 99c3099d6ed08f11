from django.urls import path

from . import views

urlpatterns = [
    path("tasks", views.TaskListView.as_view(), name="ops-tasks"),
    path("tasks/<slug:name>", views.TaskDetailView.as_view(), name="ops-task"),
    path("tasks/<slug:name>/revisions", views.RevisionListView.as_view(), name="ops-task-revisions"),
    path(
        "tasks/<slug:name>/revisions/<int:number>",
        views.RevisionDetailView.as_view(),
        name="ops-task-revision",
    ),
    path("runs", views.RunListView.as_view(), name="ops-runs"),
    path("runs/<uuid:run_id>", views.RunDetailView.as_view(), name="ops-run"),
    path("runs/<uuid:run_id>/cancel", views.RunCancelView.as_view(), name="ops-run-cancel"),
    path("runs/<uuid:run_id>/retry", views.RunRetryView.as_view(), name="ops-run-retry"),
]
