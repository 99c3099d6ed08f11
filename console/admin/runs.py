"""Tasks, revisions, runs and attempts in the admin.

Tasks are created and edited here: an edit of the execution fields writes a new immutable
revision (``actions.tasks.revision_create``); a task is never renamed or deleted (its runs pin
its revisions). Runs and attempts are protocol-owned and read-only; cancel and retry call the
run write paths.
"""

from __future__ import annotations

import difflib
import json
import re

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from actions.runs import run_cancel, run_enqueue, run_retry
from actions.tasks import revision_check, revision_create, task_create
from audit.models import ActorType, Event
from console.admin.base import (
    ModelAdmin,
    ReadOnlyAdmin,
    acting_role,
    permission_check,
    plural,
    short_id,
    table,
    when,
)
from core.db import db_now
from core.errors import DomainError
from leases.models import RunDispatchLease
from logs.selectors import read_log, run_artifacts
from placement import spec as placement_spec
from placement.matching import SUMMARY_CATEGORIES
from placement.selectors import describe_summary, live_workers, parse_placement, placement_preview
from runs import selectors
from runs.models import LostRetry, Run, RunAttempt, Task, TaskRevision
from runs.revisions import EXECUTORS, MAX_TIMEOUT_SECONDS, RETRYABLE_OUTCOMES, RevisionSpec
from runs.states import RUN_TERMINAL, AttemptState, RunState

#: Bytes of each attempt's log the run page renders itself; the page's script reads on from there.
ADMIN_LOG_BYTES = 256 * 1024

#: Environment variables whose values the console never shows (names matched case-insensitively).
SECRET_NAME = re.compile(r"secret|token|passw|pwd|key|credential|auth|private", re.IGNORECASE)
MASK = "••••••"
RUN_TONES = {
    "succeeded": "good",
    "running": "good",
    "failed": "bad",
    "lost": "bad",
    "timed_out": "bad",
    "cancelled": "quiet",
    "retry_wait": "warn",
    "queued": "warn",
    "dispatching": "warn",
}


def run_badge(state: str) -> str:
    """A run or attempt state as a coloured label."""
    return format_html('<span class="ql-state ql-{}">{}</span>', RUN_TONES.get(state, "quiet"), state)


def masked_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the values of secret-looking names replaced by a mask."""
    return {name: MASK if SECRET_NAME.search(name) else value for name, value in env.items()}


# --- tasks and revisions ---------------------------------------------------------------------------

#: Where a write path's error field lands in the task form.
FIELD_OF = {
    "name": "name",
    "executor": "executor",
    "command": "command",
    "timeoutSeconds": "timeout_seconds",
    "env": "env",
    "placement": "placement",
    "retry.maxAttempts": "max_attempts",
    "retry.retryOn": "retry_on",
    "retry.lostRetry": "lost_retry",
    "retry.backoffSeconds": "retry_backoff_seconds",
    "retry.backoffMaxSeconds": "retry_backoff_max_seconds",
}


def form_field_of(error_field: str | None) -> str | None:
    """The form field a ``DomainError.field`` names (``env.FOO`` → ``env``), or None."""
    if not error_field:
        return None
    if error_field in FIELD_OF:
        return FIELD_OF[error_field]
    head = error_field.split(".", 1)[0].split("[", 1)[0]
    if head == "retry":
        return FIELD_OF.get(error_field.split("[", 1)[0])
    return FIELD_OF.get(head)


class TaskForm(forms.ModelForm):
    """A task's name and description, and the execution fields of its next revision."""

    executor = forms.ChoiceField(choices=[(e, e) for e in EXECUTORS], initial="shell")
    command = forms.CharField(widget=forms.Textarea(attrs={"rows": 4, "class": "ql-command"}), strip=False)
    timeout_seconds = forms.IntegerField(
        min_value=1, max_value=MAX_TIMEOUT_SECONDS, initial=300, label="Timeout (s)"
    )
    env = forms.CharField(
        required=False,
        label="Environment",
        widget=forms.Textarea(attrs={"rows": 3, "class": "ql-command"}),
        help_text=f"one NAME=value a line; values of secret-looking names show as {MASK} and are kept "
        "unless you type a new value",
    )
    placement = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "ql-command"}),
        help_text='a PlacementSpec as JSON, e.g. {"required": {"arch": ["x86_64"]}}; empty: any worker '
        "with the executor (docs/placement.md)",
    )
    max_attempts = forms.IntegerField(min_value=1, max_value=20, initial=1, label="Max attempts")
    retry_on = forms.MultipleChoiceField(
        required=False,
        choices=[(o, o) for o in RETRYABLE_OUTCOMES],
        widget=forms.CheckboxSelectMultiple,
        label="Retry on",
    )
    lost_retry = forms.ChoiceField(
        choices=[(value, value) for value in LostRetry.values],
        initial=LostRetry.NEVER,
        label="Retry when lost",
    )
    retry_backoff_seconds = forms.IntegerField(min_value=1, max_value=86400, initial=10, label="Backoff (s)")
    retry_backoff_max_seconds = forms.IntegerField(
        min_value=1, max_value=86400, initial=300, label="Backoff max (s)"
    )

    class Meta:
        model = Task
        fields = ("name", "description")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.previous: TaskRevision | None = None
        if not self.instance._state.adding:
            self.previous = selectors.latest_revision(self.instance)
            for name, value in revision_initial(self.previous).items():
                self.fields[name].initial = value
        self.spec: RevisionSpec | None = None

    def _env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        old = self.previous.env if self.previous else {}
        for number, line in enumerate(self.cleaned_data.get("env", "").splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            name = name.strip()
            if not sep:
                raise forms.ValidationError({"env": f"line {number}: write NAME=value"})
            env[name] = old.get(name, "") if value == MASK and name in old else value
        return env

    def _placement(self):
        text = self.cleaned_data.get("placement", "").strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError({"placement": f"not JSON: {exc.msg} (line {exc.lineno})"}) from None
        if not isinstance(value, dict):
            raise forms.ValidationError({"placement": "must be a JSON object"})
        return value

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        spec = RevisionSpec(
            executor=cleaned["executor"],
            command=cleaned["command"],
            timeout_seconds=cleaned["timeout_seconds"],
            env=self._env(),
            placement=self._placement(),
            max_attempts=cleaned["max_attempts"],
            retry_on=tuple(cleaned.get("retry_on") or ()),
            lost_retry=cleaned["lost_retry"],
            retry_backoff_seconds=cleaned["retry_backoff_seconds"],
            retry_backoff_max_seconds=cleaned["retry_backoff_max_seconds"],
        )
        try:
            revision_check(spec)
        except DomainError as exc:
            target = form_field_of(exc.field)
            message = f"{exc.field}: {exc.message}" if exc.field and target != exc.field else exc.message
            raise forms.ValidationError({target: message} if target else message) from None
        self.spec = spec
        return cleaned


def revision_initial(revision: TaskRevision) -> dict:
    """The task form's fields for an existing revision (secrets masked)."""
    placement = json.loads(revision.placement)
    return {
        "executor": revision.executor,
        "command": revision.command,
        "timeout_seconds": revision.timeout_seconds,
        "env": "\n".join(f"{k}={v}" for k, v in masked_env(revision.env).items()),
        "placement": json.dumps(placement, indent=2),
        "max_attempts": revision.max_attempts,
        "retry_on": list(revision.retry_on),
        "lost_retry": revision.lost_retry,
        "retry_backoff_seconds": revision.retry_backoff_seconds,
        "retry_backoff_max_seconds": revision.retry_backoff_max_seconds,
    }


def same_spec(revision: TaskRevision, spec: RevisionSpec) -> bool:
    """Whether ``spec`` would write the same revision again (nothing to do)."""
    return (
        revision.executor == spec.executor
        and revision.command == spec.command
        and revision.timeout_seconds == spec.timeout_seconds
        and revision.env == spec.env
        and json.loads(revision.placement) == json.loads(revision_placement_text(spec))
        and revision.max_attempts == spec.max_attempts
        and list(revision.retry_on) == list(spec.retry_on)
        and revision.lost_retry == spec.lost_retry
        and revision.retry_backoff_seconds == spec.retry_backoff_seconds
        and revision.retry_backoff_max_seconds == spec.retry_backoff_max_seconds
    )


def revision_placement_text(spec: RevisionSpec) -> str:
    """The normalised placement ``spec`` would store (validated already by the form)."""
    return placement_spec.normalise(spec.placement or {}, executor=spec.executor).canonical_text


def revision_lines(revision: TaskRevision) -> list[str]:
    """A revision as text lines, for diffs (secrets masked)."""
    lines = [
        f"executor: {revision.executor}",
        f"timeout: {revision.timeout_seconds} s",
        f"retry: max {revision.max_attempts} attempts, on {', '.join(revision.retry_on) or 'nothing'}, "
        f"when lost {revision.lost_retry}, backoff {revision.retry_backoff_seconds}-"
        f"{revision.retry_backoff_max_seconds} s",
        f"placement: {revision.placement}",
    ]
    lines += [f"env {k}={v}" for k, v in masked_env(revision.env).items()]
    lines += [f"command | {line}" for line in revision.command.splitlines() or [""]]
    return lines


def revision_diff(older: TaskRevision | None, newer: TaskRevision) -> str:
    """What ``newer`` changed against ``older``, as an HTML unified diff (``created`` for r1)."""
    if older is None:
        return "created"
    changed = [
        line
        for line in difflib.unified_diff(revision_lines(older), revision_lines(newer), lineterm="", n=0)
        if not line.startswith(("---", "+++", "@@"))
    ]
    if not changed:
        return "no change"
    return format_html(
        '<div class="ql-diff">{}</div>',
        format_html_join(
            "",
            "<div><{}>{}</{}></div>",
            (
                ("ins" if line[0] == "+" else "del", line, "ins" if line[0] == "+" else "del")
                for line in changed
            ),
        ),
    )


def revision_table(revision: TaskRevision) -> str:
    """A revision's execution content, readable: command, executor, timeout, env, placement, retry."""
    env = masked_env(revision.env)
    rows = [
        ("revision", format_html("r{} · {}", revision.number, when(revision.created_at))),
        ("executor", revision.executor),
        ("command", format_html('<pre class="ql-pre">{}</pre>', revision.command)),
        ("timeout", f"{revision.timeout_seconds} s"),
        ("environment", format_html_join(", ", "<code>{}={}</code>", env.items()) if env else "none"),
        (
            "placement",
            format_html('<pre class="ql-pre">{}</pre>', json.dumps(json.loads(revision.placement), indent=2)),
        ),
        (
            "retry policy",
            f"{plural(revision.max_attempts, 'attempt')} at most; "
            f"retry on {', '.join(revision.retry_on) or 'nothing'}; when lost: {revision.lost_retry}; "
            f"backoff {revision.retry_backoff_seconds} s to {revision.retry_backoff_max_seconds} s",
        ),
    ]
    return format_html(
        '<table class="ql-table">{}</table>', format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
    )


@admin.action(description="Run now (newest revision)", permissions=("run_task",))
def run_now(modeladmin, request, queryset):
    for task in queryset:
        try:
            run = run_enqueue(
                revision_id=selectors.latest_revision(task).pk,
                actor_type=ActorType.OPERATOR,
                actor=request.user.get_username(),
                role=acting_role(request),
            )
        except DomainError as exc:
            modeladmin.message_user(request, f"{task.name}: {exc.code}: {exc.message}", messages.ERROR)
        else:
            modeladmin.message_user(
                request,
                format_html(
                    '{}: queued run <a href="{}">{}</a>',
                    task.name,
                    reverse("admin:runs_run_change", args=[run.pk]),
                    short_id(run.pk),
                ),
                messages.SUCCESS,
            )


@admin.register(Task)
class TaskAdmin(ModelAdmin):
    form = TaskForm
    list_display = ("name", "description", "current", "executor", "runs_link", "created")
    search_fields = ("name",)
    actions = (run_now,)
    change_form_template = "admin/runs/task/change_form.html"
    fieldsets = (
        (None, {"fields": ("name", "description")}),
        ("Next revision", {"fields": ("executor", "command", "timeout_seconds", "env", "placement")}),
        (
            "Retry policy",
            {
                "fields": (
                    "max_attempts",
                    "retry_on",
                    "lost_retry",
                    "retry_backoff_seconds",
                    "retry_backoff_max_seconds",
                )
            },
        ),
    )
    has_run_task_permission = permission_check("run_task")

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return self.fieldsets
        read = (
            ("Current revision", {"fields": ("current_revision",)}),
            ("History", {"fields": ("history",)}),
        )
        if not self.has_change_permission(request, obj):
            return ((None, {"fields": ("name", "description")}), *read)
        return (*read, *self.fieldsets)

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("name", "current_revision", "history")  # never renamed: runs and history name it

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def has_delete_permission(self, request, obj=None):
        return False  # its runs pin its revisions

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        """Unwrapped from the admin's transaction: ``task_create``/``revision_create`` are durable
        write paths that must be the outermost transaction."""
        extra_context = dict(extra_context or {})
        if object_id is not None:
            task = self.get_object(request, object_id)
            if task is not None:
                extra_context["revisions"] = list(
                    task.revisions.order_by("-number").values_list("pk", "number")
                )
                extra_context["may_run"] = self.has_run_task_permission(request)
                extra_context["run_url"] = reverse("admin:runs_task_run", args=[task.pk])
        return self._changeform_view(request, object_id, form_url, extra_context)

    def save_model(self, request, obj, form, change):
        if not change:
            revision = task_create(
                name=obj.name, description=obj.description, spec=form.spec, user=request.user
            )
            obj.pk, obj.created_at = revision.task_id, revision.task.created_at
            return
        obj.save(update_fields=["description"])
        if form.spec is not None and form.previous is not None and not same_spec(form.previous, form.spec):
            revision = revision_create(task_id=obj.pk, spec=form.spec, user=request.user)
            self.message_user(request, f"{obj.name}: new revision r{revision.number}", messages.SUCCESS)
        else:
            self.message_user(request, f"{obj.name}: execution unchanged, no new revision", messages.INFO)

    def save_related(self, request, form, formsets, change):
        return None  # no relations edited here

    def get_urls(self):
        return [
            path("<path:object_id>/run/", self.admin_site.admin_view(self.run_view), name="runs_task_run"),
            *super().get_urls(),
        ]

    def run_view(self, request, object_id):
        """POST: enqueue a run of the chosen revision (default: the newest) and open it."""
        if request.method != "POST" or not self.has_run_task_permission(request):
            raise PermissionDenied
        task = self.get_object(request, object_id)
        if task is None:
            return HttpResponseRedirect(reverse("admin:runs_task_changelist"))
        chosen = request.POST.get("revision", "")
        revisions = task.revisions.all()
        revision = revisions.filter(pk=chosen).first() if _is_uuid(chosen) else None
        revision = revision or selectors.latest_revision(task)
        try:
            run = run_enqueue(
                revision_id=revision.pk, actor_type=ActorType.OPERATOR, actor=request.user.get_username()
            )
        except DomainError as exc:
            self.message_user(request, f"{task.name}: {exc.code}: {exc.message}", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:runs_task_change", args=[task.pk]))
        self.message_user(request, f"{task.name}: queued a run of r{revision.number}", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:runs_run_change", args=[run.pk]))

    @admin.display(description="current")
    def current(self, task):
        number = task.revisions.order_by("-number").values_list("number", flat=True).first()
        return f"r{number}" if number else "—"

    @admin.display(description="executor")
    def executor(self, task):
        return task.revisions.order_by("-number").values_list("executor", flat=True).first() or "—"

    @admin.display(description="runs")
    def runs_link(self, task):
        return format_html(
            '<a href="{}?task__id__exact={}">runs</a>', reverse("admin:runs_run_changelist"), task.pk
        )

    @admin.display(description="created", ordering="created_at")
    def created(self, task):
        return when(task.created_at)

    @admin.display(description="current revision")
    def current_revision(self, task):
        revision = selectors.latest_revision(task)
        url = reverse("admin:runs_taskrevision_change", args=[revision.pk])
        return format_html(
            '{}<p><a href="{}">placement preview of r{}</a></p>',
            revision_table(revision),
            url,
            revision.number,
        )

    @admin.display(description="revisions, newest first")
    def history(self, task):
        revisions = list(task.revisions.select_related("created_by").order_by("-number")[:50])
        rows = []
        for index, revision in enumerate(revisions):
            older = revisions[index + 1] if index + 1 < len(revisions) else None
            if older is None and revision.number > 1:
                older = task.revisions.filter(number=revision.number - 1).first()
            rows.append(
                (
                    reverse("admin:runs_taskrevision_change", args=[revision.pk]),
                    revision.number,
                    when(revision.created_at),
                    revision.created_by.get_username() if revision.created_by else "—",
                    revision_diff(older, revision),
                )
            )
        rows = [(format_html('<a href="{}">r{}</a>', url, number), *rest) for url, number, *rest in rows]
        return table(("revision", "created", "by", "changes"), rows)


def _is_uuid(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-fA-F-]{32,36}", text or ""))

    def has_delete_permission(self, request, obj=None):
        return False  # revisions and runs point at a task (PROTECT): it is never deleted


@admin.register(TaskRevision)
class TaskRevisionAdmin(ReadOnlyAdmin):
    list_display = ("task", "revision", "executor", "timeout_seconds", "max_attempts", "created")
    list_select_related = ("task",)
    fields = ("task", "content", "placement_preview")
    readonly_fields = ("task", "content", "placement_preview")

    def get_queryset(self, request):
        return super().get_queryset(request).defer("command", "env")

    @admin.display(description="revision", ordering="number")
    def revision(self, revision):
        return f"r{revision.number}"

    @admin.display(description="created", ordering="created_at")
    def created(self, revision):
        return when(revision.created_at)

    @admin.display(description="execution")
    def content(self, revision):
        return revision_table(revision)

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
            "{} of {} would take it now{}",
            preview.eligible,
            plural(preview.live_workers, "live worker"),
            why_not,
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
                    ", ".join(r.categories) or "—",
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
            '<p>{}</p><table class="ql-table"><tr><th>worker</th><th>would take it</th><th>score</th>'
            "<th>free slots</th><th>mismatch</th></tr>{}</table>{}",
            heading,
            body,
            more,
        )


# --- runs ---------------------------------------------------------------------------------------------


@admin.action(description="Cancel", permissions=("cancel_run",))
def cancel(modeladmin, request, queryset):
    for run in queryset:
        try:
            result = run_cancel(
                run_id=run.pk,
                actor_type=ActorType.OPERATOR,
                actor=request.user.get_username(),
                role=acting_role(request),
                reason="cancelled in the admin",
            )
        except DomainError as exc:
            modeladmin.message_user(request, f"run {run.pk}: {exc.code}: {exc.message}", messages.ERROR)
            continue
        text = {
            "requested": "cancellation requested",
            "already_requested": "cancellation was already requested",
            "already_terminal": f"already {result.run.state}, nothing to cancel",
        }.get(result.status, result.status)
        modeladmin.message_user(request, format_html("run {}: {}", short_id(run.pk), text), messages.SUCCESS)


@admin.action(description="Retry (a new run of the same revision)", permissions=("retry_run",))
def retry(modeladmin, request, queryset):
    for run in queryset:
        try:
            new = run_retry(
                run_id=run.pk,
                actor_type=ActorType.OPERATOR,
                actor=request.user.get_username(),
                role=acting_role(request),
            )
        except DomainError as exc:
            modeladmin.message_user(
                request,
                format_html("run {}: {}: {}", short_id(run.pk), exc.code, exc.message),
                messages.ERROR,
            )
            continue
        modeladmin.message_user(
            request,
            format_html(
                'run {}: retried as <a href="{}">{}</a>',
                short_id(run.pk),
                reverse("admin:runs_run_change", args=[new.pk]),
                short_id(new.pk),
            ),
            messages.SUCCESS,
        )


class WaitingFilter(admin.SimpleListFilter):
    """Runs waiting for a lease, by reason (``?waiting=arch``; ``none``: no live worker; ``any``)."""

    title = "why waiting"
    parameter_name = "waiting"

    def lookups(self, request, model_admin):
        return [("any", "any reason"), ("none", "no live worker"), *[(c, c) for c in SUMMARY_CATEGORIES]]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        waiting = queryset.filter(
            state__in=(RunState.QUEUED, RunState.DISPATCHING), placement_summary__isnull=False
        )
        if value == "any":
            return waiting
        if value == "none":
            return waiting.filter(placement_summary={})
        return waiting.filter(placement_summary__has_key=value)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = (
        "run",
        "task",
        "state_label",
        "outcome",
        "attempt_count",
        "why_waiting",
        "created_by",
        "created",
        "finished",
    )
    list_filter = ("state", WaitingFilter)
    list_select_related = ("task",)
    search_fields = ("=id", "task__name")
    actions = (cancel, retry)
    change_form_template = "admin/runs/run/change_form.html"
    fields = (
        "task",
        "revision_link",
        "state_label",
        "outcome",
        "cancel",
        "created_by",
        "priority",
        "times",
        "why_waiting_detail",
        "scheduled_by",
        "attempts_table",
        "live_log",
        "artifacts",
        "output",
        "timeline",
    )
    readonly_fields = fields
    show_full_result_count = False

    has_cancel_run_permission = permission_check("cancel_run")
    has_retry_run_permission = permission_check("retry_run")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        actions = [(name, text) for name, (_f, name, text) in self.get_actions(request).items()]
        context = {
            "object_actions": actions,
            "changelist_url": reverse("admin:runs_run_changelist"),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    @admin.display(description="run", ordering="id")
    def run(self, run):
        return short_id(run.pk)

    @admin.display(description="state", ordering="state")
    def state_label(self, run):
        if run.cancel_requested_at and run.state not in RUN_TERMINAL:
            return format_html("{} {}", run_badge(run.state), run_badge("cancelling"))
        return run_badge(run.state)

    @admin.display(description="outcome")
    def outcome(self, run):
        parts = []
        if run.exit_code is not None:
            parts.append(f"exit {run.exit_code}")
        if run.error_class:
            parts.append(run.error_class)
        return ", ".join(parts) or "—"

    @admin.display(description="why waiting")
    def why_waiting(self, run):
        # The summary describes a run waiting for a lease; once claimed it is history, not a reason.
        if run.state not in (RunState.QUEUED, RunState.DISPATCHING) or run.placement_summary is None:
            return "—"
        return describe_summary(run.placement_summary)

    @admin.display(description="created", ordering="created_at")
    def created(self, run):
        return when(run.created_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, run):
        return when(run.finished_at)

    @admin.display(description="revision")
    def revision_link(self, run):
        return format_html(
            '<a href="{}">r{}</a> ({})',
            reverse("admin:runs_taskrevision_change", args=[run.revision_id]),
            run.revision.number,
            run.revision.executor,
        )

    @admin.display(description="cancellation")
    def cancel(self, run):
        if run.cancel_requested_at is None:
            return "—"
        return format_html(
            "requested {} — {}", when(run.cancel_requested_at), run.cancel_reason or "no reason given"
        )

    @admin.display(description="times")
    def times(self, run):
        return format_html(
            "created {}<br>started {}<br>finished {}{}",
            when(run.created_at),
            when(run.started_at),
            when(run.finished_at),
            format_html("<br>next attempt {}", when(run.next_attempt_at)) if run.next_attempt_at else "",
        )

    @admin.display(description="started by schedule")
    def scheduled_by(self, run):
        fire = getattr(run, "schedule_fire", None) if run.pk else None
        if fire is None:
            return "—"
        return format_html(
            '<a href="{}">{}</a> — fire of {}',
            reverse("admin:schedules_schedule_change", args=[fire.schedule_id]),
            short_id(fire.schedule_id),
            when(fire.fire_at),
        )

    @admin.display(description="why waiting")
    def why_waiting_detail(self, run):
        text = self.why_waiting(run)
        if text == "—":
            return text
        return format_html(
            '{} (checked {}) — <a href="{}">placement preview</a>',
            text,
            when(run.placement_checked_at),
            reverse("admin:runs_taskrevision_change", args=[run.revision_id]),
        )

    @admin.display(description="attempts")
    def attempts_table(self, run):
        attempts = list(
            RunAttempt.objects.filter(run=run)
            .select_related("worker")
            .defer("stdout_tail", "stderr_tail")
            .order_by("number")
        )
        leases: dict[object, list[str]] = {}
        for lease in (
            # by attempt, not run: lease_generation_unique serves it (the run column has no index)
            RunDispatchLease.objects.filter(attempt_id__in=[attempt.pk for attempt in attempts])
            .order_by("lease_generation")
            .only("attempt_id", "lease_generation", "state", "session_generation", "release_reason")
        ):
            reason = f" {lease.release_reason}" if lease.release_reason else ""
            leases.setdefault(lease.attempt_id, []).append(
                f"g{lease.lease_generation} {lease.state}{reason} (session gen {lease.session_generation})"
            )
        rows = []
        for attempt in attempts:
            waiting = attempt.state == AttemptState.CLAIMED and attempt.worker_id is None
            worker = (
                format_html(
                    '<a href="{}">{}</a>',
                    reverse("admin:workers_worker_change", args=[attempt.worker_id]),
                    attempt.worker.name,
                )
                if attempt.worker
                else "—"
            )
            rows.append(
                (
                    reverse("admin:runs_runattempt_change", args=[attempt.pk]),
                    attempt.number,
                    run_badge("waiting for a lease") if waiting else run_badge(attempt.state),
                    worker,
                    "; ".join(leases.get(attempt.pk, [])) or "—",
                    "—" if attempt.exit_code is None else attempt.exit_code,
                    attempt.outcome_reason or "—",
                    when(attempt.started_at),
                    when(attempt.finished_at),
                )
            )
        if not rows:
            return "none"
        headers = ("attempt", "state", "worker", "leases", "exit", "reason", "started", "finished")
        rows = [(format_html('<a href="{}">#{}</a>', url, number), *rest) for url, number, *rest in rows]
        return table(headers, rows)

    @admin.display(description="log")
    def live_log(self, run):
        """Every attempt's stored log; a live one follows itself (``?after=`` polling by the
        page's script, templates/admin/runs/run/change_form.html; docs/logs.md, Reading)."""
        attempts = list(RunAttempt.objects.filter(run=run).only("id", "number", "state").order_by("number"))
        if not attempts:
            return "no attempt yet"
        url = reverse("ops-run-log", args=[run.pk])
        blocks = []
        for attempt in attempts:
            try:
                piece = read_log(attempt, limit=ADMIN_LOG_BYTES)
            except DomainError as exc:
                if exc.code != "log_expired":
                    raise
                expired = str((exc.details or {}).get("expiredAt") or "")
                blocks.append(
                    (attempt.number, f"log expired on {expired[:10]}", "", "", "true", 0, attempt.number, "")
                )
                continue
            blocks.append(
                (
                    attempt.number,
                    "ended" if piece.complete else "live",
                    f"{url}?attempt={attempt.number}",
                    f"{url}?attempt={attempt.number}",
                    "true" if piece.complete else "false",
                    piece.next_offset,
                    attempt.number,
                    piece.data.decode("utf-8", errors="replace"),
                )
            )
        return format_html_join(
            "",
            '<p>attempt #{} <span class="ql-log-state">{}</span> — <a href="{}">plain text</a></p>'
            '<pre class="ql-pre ql-log" data-log-url="{}" data-complete="{}" data-next-offset="{}" '
            'id="ql-log-{}" style="max-height: 32em; overflow: auto">{}</pre>',
            blocks,
        )

    @admin.display(description="artifacts")
    def artifacts(self, run):
        stored = run_artifacts(run.pk)
        if not stored:
            return "none"
        rows = [
            (
                f"#{artifact.attempt.number}",
                format_html(
                    '<a href="{}" download>{}</a>',
                    reverse("ops-run-artifact", args=[run.pk, artifact.pk]),
                    artifact.name,
                ),
                artifact.size,
                format_html("<code>{}</code>", artifact.sha256),
                when(artifact.expires_at),
            )
            for artifact in stored
        ]
        return table(("attempt", "name", "bytes", "SHA-256", "kept until"), rows)

    @admin.display(description="output (bounded tails of the latest attempt that reported)")
    def output(self, run):
        attempt = (
            RunAttempt.objects.filter(run=run)
            .exclude(stdout_tail="", stderr_tail="")
            .order_by("-number")
            .only("number", "stdout_tail", "stderr_tail")
            .first()
        )
        if attempt is None:
            return "no output yet (tails arrive with the attempt's outcome)"
        return format_html(
            '<p>attempt #{} stdout</p><pre class="ql-pre" id="ql-stdout">{}</pre>'
            '<p>stderr</p><pre class="ql-pre" id="ql-stderr">{}</pre>',
            attempt.number,
            attempt.stdout_tail or "(empty)",
            attempt.stderr_tail or "(empty)",
        )

    @admin.display(description="timeline")
    def timeline(self, run):
        events = list(Event.objects.filter(run_id=run.pk).order_by("id")[:200])
        rows = [
            (
                when(event.created_at),
                event.kind,
                f"{event.actor_type}{': ' + event.actor if event.actor else ''}",
                short_id(event.attempt_id) if event.attempt_id else "—",
                json.dumps(event.data, sort_keys=True) if event.data else "",
            )
            for event in events
        ]
        return table(("time", "event", "actor", "attempt", "facts"), rows)


@admin.register(RunAttempt)
class RunAttemptAdmin(ReadOnlyAdmin):
    list_display = (
        "attempt",
        "run_link",
        "number",
        "state_label",
        "worker",
        "exit_code",
        "started",
        "finished",
    )
    list_filter = ("state",)
    list_select_related = ("worker",)
    search_fields = ("=run__id", "=id")
    exclude = ("stdout_tail", "stderr_tail")
    readonly_fields = ("tails",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("stdout_tail", "stderr_tail")

    @admin.display(description="attempt", ordering="id")
    def attempt(self, attempt):
        return short_id(attempt.pk)

    @admin.display(description="run")
    def run_link(self, attempt):
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:runs_run_change", args=[attempt.run_id]),
            short_id(attempt.run_id),
        )

    @admin.display(description="state", ordering="state")
    def state_label(self, attempt):
        if attempt.state == AttemptState.CLAIMED and attempt.worker_id is None:
            return run_badge("waiting for a lease")
        return run_badge(attempt.state)

    @admin.display(description="started", ordering="started_at")
    def started(self, attempt):
        return when(attempt.started_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, attempt):
        return when(attempt.finished_at)

    @admin.display(description="output tails")
    def tails(self, attempt):
        return format_html(
            '<p>stdout</p><pre class="ql-pre">{}</pre><p>stderr</p><pre class="ql-pre">{}</pre>',
            attempt.stdout_tail or "(empty)",
            attempt.stderr_tail or "(empty)",
        )
