from django.urls import path

from . import views

urlpatterns = [
    path("schedules", views.ScheduleListView.as_view(), name="ops-schedules"),
    path("schedules/preview", views.SchedulePreviewView.as_view(), name="ops-schedule-preview"),
    path("schedules/<uuid:schedule_id>", views.ScheduleDetailView.as_view(), name="ops-schedule"),
]
