"""Schedules in the admin: edit with a live fire-time preview; every save goes through
``actions.schedules`` (validated, audited, compare-and-swap). Fires are shown, never edited.

Permissions are Django's model permissions on ``schedules.Schedule`` (add, change, delete,
view), which ``ModelAdmin.has_*_permission`` checks.
"""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import available_timezones

from django import forms
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from actions.schedules import schedule_create, schedule_delete, schedule_update
from console.admin.base import ModelAdmin, acting_role
from core.errors import DomainError
from schedules import rules, selectors
from schedules.models import MisfirePolicy, OverlapPolicy, Schedule, ScheduleFire

#: API field names (as ``rules.validate_spec`` names them) → form fields.
FORM_FIELDS = {
    "cron": "cron",
    "timezone": "timezone",
    "startAt": "start_at",
    "endAt": "end_at",
    "overlap": "overlap",
    "misfire": "misfire",
    "misfireGraceSeconds": "misfire_grace_seconds",
    "jitterSeconds": "jitter_seconds",
    "priority": "priority",
    "description": "description",
}
SPEC_FIELDS = (
    "cron",
    "timezone",
    "enabled",
    "start_at",
    "end_at",
    "overlap",
    "misfire",
    "misfire_grace_seconds",
    "jitter_seconds",
    "priority",
    "description",
)
ZONES = sorted(available_timezones() | {"UTC"})


def spec_from(data: dict) -> rules.ScheduleSpec:
    """The form's cleaned data as the spec the write paths take."""
    return rules.ScheduleSpec(
        cron=data["cron"],
        timezone=data["timezone"],
        enabled=bool(data.get("enabled")),
        start_at=data.get("start_at"),
        end_at=data.get("end_at"),
        overlap=data["overlap"],
        misfire=data["misfire"],
        misfire_grace_seconds=data["misfire_grace_seconds"],
        jitter_seconds=data["jitter_seconds"],
        priority=data["priority"],
        description=data.get("description") or "",
    )


class ScheduleForm(forms.ModelForm):
    timezone = forms.ChoiceField(choices=[(zone, zone) for zone in ZONES], initial="UTC")
    expected_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Schedule
        fields = ("task", *SPEC_FIELDS)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["expected_version"].initial = self.instance.version

    def clean(self):
        data = super().clean()
        if any(name in self.errors for name in SPEC_FIELDS):
            return data
        try:
            data["cron"] = rules.validate_spec(
                spec_from(data), overlaps=tuple(OverlapPolicy.values), misfires=tuple(MisfirePolicy.values)
            ).cron
        except DomainError as exc:
            self.add_error(FORM_FIELDS.get(exc.field or "", None), exc.message)
        expected = data.get("expected_version")
        if self.instance.pk is not None and expected is not None and expected != self.instance.version:
            self.add_error(None, "Someone changed this schedule since you opened it; reload and try again.")
        return data


class ScheduleAdmin(ModelAdmin):
    form = ScheduleForm
    list_display = (
        "task",
        "cron",
        "timezone",
        "enabled",
        "overlap",
        "misfire",
        "next_fire",
        "last_fire_at",
        "last_outcome",
        "last_run",
    )
    list_filter = ("enabled", "overlap", "misfire")
    list_select_related = ("task", "last_run")
    search_fields = ("task__name", "cron", "description")
    readonly_fields = (
        "preview",
        "next_fires",
        "last_fire_at",
        "last_outcome",
        "last_run",
        "pending_fire_at",
        "jitter_offset",
        "version",
        "recent_fires",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "task",
                    "description",
                    "cron",
                    "timezone",
                    "preview",
                    "enabled",
                    "start_at",
                    "end_at",
                )
            },
        ),
        (
            "Policies",
            {"fields": ("overlap", "misfire", "misfire_grace_seconds", "jitter_seconds", "priority")},
        ),
        (
            "Admission",
            {
                "fields": (
                    "next_fires",
                    "last_fire_at",
                    "last_outcome",
                    "last_run",
                    "pending_fire_at",
                    "jitter_offset",
                    "version",
                    "recent_fires",
                    "expected_version",
                )
            },
        ),
    )

    class Media:
        js = ("console/schedule_preview.js",)

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        return (*fields, "task") if obj is not None else fields  # a schedule stays on its task

    @admin.display(description="next fire")
    def next_fire(self, schedule):
        if schedule.next_fire_at is None:
            return "—"
        return schedule.next_fire_at.astimezone(rules.validate_zone(schedule.timezone)).isoformat()

    @admin.display(description="preview while editing")
    def preview(self, schedule):
        return format_html(
            '<div id="schedule-preview" data-url="{}">Type an expression to see its next fire times.</div>',
            reverse("ops-schedule-preview"),
        )

    @admin.display(description="next fire times (saved settings)")
    def next_fires(self, schedule):
        if schedule.pk is None or schedule.next_fire_at is None:
            return "—"
        times = selectors.upcoming(schedule, 5, after=schedule.next_fire_at - timedelta(microseconds=1))
        return format_html(
            "<ol>{}</ol>", format_html_join("", "<li>{}</li>", ((t.isoformat(),) for t in times))
        )

    @admin.display(description="jitter offset")
    def jitter_offset(self, schedule):
        if schedule.pk is None:
            return "—"
        return f"{int(rules.jitter_offset(schedule.pk, schedule.jitter_seconds).total_seconds())} s"

    @admin.display(description="recent fires")
    def recent_fires(self, schedule):
        if schedule.pk is None:
            return "—"
        fires = ScheduleFire.objects.filter(schedule=schedule).select_related("run").order_by("-fire_at")[:10]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    fire.fire_at.isoformat(),
                    fire.outcome,
                    fire.fires,
                    format_html(
                        '<a href="{}">{}</a>',
                        reverse("admin:runs_run_change", args=[fire.run_id]),
                        fire.run_id,
                    )
                    if fire.run_id
                    else "—",
                )
                for fire in fires
            ),
        )
        return format_html(
            "<table><tr><th>fire time (UTC)</th><th>outcome</th><th>fires</th><th>run</th></tr>{}</table>",
            rows,
        )

    # Django wraps these views in transaction.atomic(); a write path opens its own durable
    # transaction (core.db.write_path), which must be the outermost one.
    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return self._changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        return self._delete_view(request, object_id, extra_context)

    def save_model(self, request, obj, form, change):
        spec = spec_from(form.cleaned_data)
        if change:
            expected = form.cleaned_data.get("expected_version")
            saved = schedule_update(
                schedule_id=obj.pk,
                spec=spec,
                expected_version=expected if expected is not None else obj.version,
                user=request.user,
                role=acting_role(request),
            )
        else:
            saved = schedule_create(
                task_id=form.cleaned_data["task"].pk, spec=spec, user=request.user, role=acting_role(request)
            )
        obj.pk, obj.version = saved.pk, saved.version
        obj._state.adding = False

    def delete_model(self, request, obj):
        schedule_delete(schedule_id=obj.pk, user=request.user, role=acting_role(request))

    def delete_queryset(self, request, queryset):
        for schedule_id in queryset.values_list("pk", flat=True):
            schedule_delete(schedule_id=schedule_id, user=request.user, role=acting_role(request))


admin.site.register(Schedule, ScheduleAdmin)
