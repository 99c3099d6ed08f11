"""Tasks, revisions, runs and attempts in the admin. Runs and attempts are protocol-owned: read-only."""

import json

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from actions.runs import run_cancel, run_enqueue
from audit.models import ActorType
from console.admin.base import ModelAdmin, ReadOnlyAdmin
from core.db import db_now
from core.errors import DomainError
from placement.selectors import describe_summary, live_workers, parse_placement, placement_preview
from runs import selectors
from runs.models import Run, RunAttempt, Task, TaskRevision
from runs.states import RunState


@admin.action(description="Run now (newest revision)")
def run_now(modeladmin, request, queryset):
    for task in queryset:
        try:
            run = run_enqueue(
                revision_id=selectors.latest_revision(task).pk,
                actor_type=ActorType.OPERATOR,
                actor=request.user.get_username(),
            )
        except DomainError as exc:
            modeladmin.message_user(request, f"{task.name}: {exc.code}: {exc.message}", messages.ERROR)
        else:
            modeladmin.message_user(request, f"{task.name}: queued run {run.pk}", messages.SUCCESS)


class RevisionInline(admin.TabularInline):
    model = TaskRevision
    fields = ("number", "executor", "timeout_seconds", "max_attempts", "lost_retry", "placement_sha256")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Task)
class TaskAdmin(ModelAdmin):
    list_display = ("name", "description", "created_at")
    search_fields = ("name",)
    inlines = (RevisionInline,)
    actions = (run_now,)

    def has_add_permission(self, request):
        return False  # tasks are created through the operator API with a validated revision


@admin.register(TaskRevision)
class TaskRevisionAdmin(ReadOnlyAdmin):
    list_display = ("task", "number", "executor", "timeout_seconds", "max_attempts", "created_at")
    list_select_related = ("task",)
    readonly_fields = ("placement_pretty", "placement_preview")
    exclude = ("placement",)

    @admin.display(description="placement (normalised)")
    def placement_pretty(self, revision):
        return format_html("<pre>{}</pre>", json.dumps(json.loads(revision.placement), indent=2))

    @admin.display(description="placement preview: live workers now")
    def placement_preview(self, revision):
        preview = placement_preview(
            parse_placement(revision.placement_sha256, revision.placement), live_workers(now=db_now())
        )
        if not preview.live_workers:
            return "no live workers"
        why_not = ""
        if preview.summary is not None:
            why_not = format_html(" — why not: {}", describe_summary(preview.summary))
        heading = format_html(
            "{} of {} live workers would take it now{}", preview.eligible, preview.live_workers, why_not
        )
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    r.worker.worker_name,
                    "takes it" if r.eligible else "no",
                    r.score,
                    r.worker.free_slots,
                    r.category or "—",
                )
                for r in preview.rows
            ),
        )
        more = (
            format_html("<p>showing {} of {}</p>", len(preview.rows), preview.live_workers)
            if preview.truncated
            else ""
        )
        return format_html(
            "<p>{}</p><table><tr><th>worker</th><th>would take it</th><th>score</th>"
            "<th>free slots</th><th>mismatch</th></tr>{}</table>{}",
            heading,
            body,
            more,
        )


@admin.action(description="Cancel")
def cancel(modeladmin, request, queryset):
    for run in queryset:
        try:
            result = run_cancel(
                run_id=run.pk,
                actor_type=ActorType.OPERATOR,
                actor=request.user.get_username(),
                reason="cancelled in the admin",
            )
        except DomainError as exc:
            modeladmin.message_user(request, f"{run.pk}: {exc.code}: {exc.message}", messages.ERROR)
        else:
            modeladmin.message_user(request, f"{run.pk}: {result.status}", messages.SUCCESS)


class AttemptInline(admin.TabularInline):
    model = RunAttempt
    fields = (
        "number",
        "state",
        "worker",
        "lease_generation",
        "exit_code",
        "outcome_reason",
        "started_at",
        "finished_at",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task",
        "state",
        "priority",
        "attempt_count",
        "waiting_reason",
        "created_at",
        "finished_at",
    )
    list_filter = ("state",)
    list_select_related = ("task",)
    search_fields = ("=id", "task__name")
    inlines = (AttemptInline,)
    actions = (cancel,)
    readonly_fields = ("waiting_reason", "placement_checked_at", "scheduled_by")

    @admin.display(description="started by schedule")
    def scheduled_by(self, run):
        fire = getattr(run, "schedule_fire", None) if run.pk else None
        if fire is None:
            return "—"
        return format_html(
            '<a href="{}">{}</a> — fire of {}',
            reverse("admin:schedules_schedule_change", args=[fire.schedule_id]),
            fire.schedule_id,
            fire.fire_at.isoformat(),
        )

    @admin.display(description="why waiting")
    def waiting_reason(self, run):
        # The summary describes a run waiting for a lease; once claimed it is history, not a reason.
        if run.state not in (RunState.QUEUED, RunState.DISPATCHING) or run.placement_summary is None:
            return "—"
        return describe_summary(run.placement_summary)


@admin.register(RunAttempt)
class RunAttemptAdmin(ReadOnlyAdmin):
    list_display = ("run", "number", "state", "worker", "exit_code", "started_at", "finished_at")
    list_filter = ("state",)
    list_select_related = ("worker",)
    search_fields = ("=run__id", "=id")

    def get_queryset(self, request):
        return super().get_queryset(request).defer("stdout_tail", "stderr_tail")
