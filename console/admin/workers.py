"""Operators' worker management: enroll, drain, revoke, rotate; sessions and credentials read-only.

A worker's state on these pages is its *live* state (``workers.selectors.live_state``), derived
from its newest session and the clock: a worker whose session lease lapsed reads ``expired`` at
once, never "active".
"""

import json
from datetime import timedelta

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, JSONField, OuterRef, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from actions.credentials import credential_force_rotation
from actions.enrollment import enrollment_token_create, worker_create
from actions.sessions.shutdown import session_operator_offline
from actions.workers import worker_drain, worker_revoke, worker_undrain
from audit.models import Event
from console.admin.base import (
    ModelAdmin,
    ReadOnlyAdmin,
    acting_role,
    age,
    permission_check,
    plural,
    short_id,
    table,
    when,
)
from core.conf import protocol
from core.db import db_now
from core.errors import DomainError
from leases.models import LeaseState, RunDispatchLease
from runs.models import RunAttempt
from runs.states import ATTEMPT_LIVE
from workers.models import (
    LIVE_SESSION_STATES,
    EnrollmentToken,
    Worker,
    WorkerCredential,
    WorkerSession,
)
from workers.selectors import LIVE_STATES, live_state, live_state_filter, with_current_session
from workers.versions import outdated_live_workers, version_verdict

TONES = {"online": "good", "draining": "warn", "expired": "bad", "revoked": "bad"}


def state_badge(state: str) -> str:
    """A live or stored state as a small coloured label."""
    return format_html('<span class="ql-state ql-{}">{}</span>', TONES.get(state, "quiet"), state)


def _each(modeladmin, request, queryset, action, done):
    """Run ``action`` for each selected worker and say, per worker, what its state is now.

    ``done``: the state the act leads to; a worker the act left unchanged says so (undrain of a
    revoked worker reads "revoked: not draining, nothing changed", not "active").
    """
    for worker in queryset:
        before = worker.state
        try:
            result = action(worker_id=worker.pk, actor=request.user.get_username(), role=acting_role(request))
        except DomainError as exc:
            modeladmin.message_user(request, f"{worker.name}: {exc.code}: {exc.message}", messages.ERROR)
            continue
        after = getattr(result, "state", None)
        if isinstance(result, Worker) and after == before and done != after:
            modeladmin.message_user(
                request, f"{worker.name}: nothing changed, the worker is {after}", messages.WARNING
            )
        else:
            modeladmin.message_user(request, f"{worker.name}: {done}", messages.SUCCESS)


def _token_message(request, worker, issued) -> str:
    return format_html(
        "{}: enrollment token (single use, shown only now, expires {}):<br><code>{}</code><br>"
        "on the machine: <code>qinglong-worker enroll --server {} --token {}</code>",
        worker.name,
        when(issued.record.expires_at),
        issued.token,
        request.build_absolute_uri("/").rstrip("/"),
        issued.token,
    )


@admin.action(description="Issue an enrollment token (shown once)", permissions=("issue_enrollment_token",))
def issue_enrollment_token(modeladmin, request, queryset):
    for worker in queryset:
        try:
            issued = enrollment_token_create(
                worker_id=worker.pk, user=request.user, role=acting_role(request)
            )
        except DomainError as exc:
            modeladmin.message_user(request, f"{worker.name}: {exc.code}: {exc.message}", messages.ERROR)
            continue
        modeladmin.message_user(request, _token_message(request, worker, issued), messages.WARNING)


@admin.action(description="Drain (no new runs, survives restarts)", permissions=("drain_worker",))
def drain(modeladmin, request, queryset):
    _each(modeladmin, request, queryset, worker_drain, "draining")


@admin.action(description="Undrain", permissions=("drain_worker",))
def undrain(modeladmin, request, queryset):
    _each(modeladmin, request, queryset, worker_undrain, "active")


@admin.action(
    description="Revoke (credentials die, session fenced, leases settled)", permissions=("revoke_worker",)
)
def revoke(modeladmin, request, queryset):
    _each(modeladmin, request, queryset, worker_revoke, "revoked")


@admin.action(
    description="Force offline (active run leases are settled: started attempts lost)",
    permissions=("force_offline_worker",),
)
def force_offline(modeladmin, request, queryset):
    def take_offline(*, worker_id, actor, role):
        return session_operator_offline(worker_id=worker_id, force=True, actor=actor, role=role)

    _each(modeladmin, request, queryset, take_offline, "session offline")


@admin.action(description="Force key rotation", permissions=("rotate_worker_credential",))
def force_rotation(modeladmin, request, queryset):
    _each(modeladmin, request, queryset, credential_force_rotation, "must rotate its key")


class LiveStateFilter(admin.SimpleListFilter):
    """Filter by live state (``?live=online``), plus ``outdated``: a live agent the version policy
    refuses (``workers.versions``)."""

    title = "live state"
    parameter_name = "live"

    def lookups(self, request, model_admin):
        return [(state, state) for state in (*LIVE_STATES, "outdated")]

    def queryset(self, request, queryset):
        value = self.value()
        now = db_now()
        if value == "outdated":
            return queryset.filter(pk__in=outdated_live_workers(now=now))
        if value in LIVE_STATES:
            return queryset.filter(live_state_filter(value, now=now))
        return queryset


def _labels_of_newest_session():
    newest = WorkerSession.objects.filter(worker=OuterRef("pk")).order_by("-generation")
    labels = KeyTextTransform("labels", Cast("capabilities", JSONField()))
    return Subquery(newest.annotate(labels_text=labels).values("labels_text")[:1])


def _active_leases():
    leases = (
        RunDispatchLease.objects.filter(worker=OuterRef("pk"), state=LeaseState.LEASED)
        .order_by()
        .values("worker")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(leases, output_field=IntegerField()), 0)


@admin.register(Worker)
class WorkerAdmin(ModelAdmin):
    list_display = (
        "name",
        "live",
        "lease_renewed",
        "generation_version",
        "capacity",
        "labels_summary",
        "agent_version",
        "created",
    )
    list_filter = (LiveStateFilter,)
    search_fields = ("name",)
    fields = ("name", "description")
    readonly_fields = (
        "live",
        "administrative_state",
        "current_session",
        "capabilities",
        "current_attempts",
        "session_history",
        "recent_events",
        "drain_requested_at",
        "revoked_at",
        "rotation_required",
        "created",
    )
    actions = (issue_enrollment_token, drain, undrain, revoke, force_offline, force_rotation)
    change_form_template = "admin/ql_change_form.html"

    def get_queryset(self, request):
        queryset = with_current_session(super().get_queryset(request))
        return queryset.annotate(session_labels=_labels_of_newest_session(), active_leases=_active_leases())

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("name", "description")
        return ("name", "description", *self.readonly_fields)

    has_issue_enrollment_token_permission = permission_check("issue_enrollment_token")
    has_drain_worker_permission = permission_check("drain_worker")
    has_revoke_worker_permission = permission_check("revoke_worker")
    has_force_offline_worker_permission = permission_check("force_offline_worker")
    has_rotate_worker_credential_permission = permission_check("rotate_worker_credential")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("name", *self.readonly_fields)

    # --- adding: the write path runs outside the admin's transaction ---------------------------

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        """Django wraps this view in ``transaction.atomic``; ``worker_create`` and
        ``enrollment_token_create`` are durable write paths that must be the outermost
        transaction, so adding runs unwrapped (editing a description stays wrapped)."""
        if object_id is None:
            return self._changeform_view(request, object_id, form_url, extra_context)
        return super().changeform_view(request, object_id, form_url, extra_context)

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["description"])
            return
        created = worker_create(
            name=obj.name,
            description=obj.description,
            actor=request.user.get_username(),
            role=acting_role(request),
        )
        obj.pk, obj.state, obj.created_at = created.pk, created.state, created.created_at

    def response_add(self, request, obj, post_url_continue=None):
        """Show the new worker's enrollment token and the exact command, once."""
        try:
            issued = enrollment_token_create(worker_id=obj.pk, user=request.user, role=acting_role(request))
        except DomainError as exc:
            self.message_user(request, f"{obj.name}: {exc.code}: {exc.message}", messages.ERROR)
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Enroll {obj.name}",
            "opts": self.opts,
            "worker": obj,
            "token": issued.token,
            "expires": when(issued.record.expires_at),
            "server": request.build_absolute_uri("/").rstrip("/"),
            "change_url": reverse("admin:workers_worker_change", args=[obj.pk]),
        }
        return TemplateResponse(request, "admin/workers/worker/enrolled.html", context)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        if obj is None and "name" in form.base_fields:
            form.base_fields[
                "name"
            ].help_text = "a lowercase slug, e.g. build-box-1; it cannot be changed later"
        return form

    # --- the detail page's actions: the bulk actions this user may run, for this one worker -----

    def change_view(self, request, object_id, form_url="", extra_context=None):
        actions = [
            (name, description)
            for name, (_func, name, description) in self.get_actions(request).items()
            if name != "delete_selected"
        ]
        context = {
            "object_actions": actions,
            "changelist_url": reverse("admin:workers_worker_changelist"),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def has_delete_permission(self, request, obj=None):
        return False  # a worker is revoked, never deleted: its sessions and attempts point at it

    # --- columns --------------------------------------------------------------------------------

    def _live(self, worker) -> str:
        if not hasattr(worker, "session_state"):
            worker = self.get_queryset_for(worker)
        return live_state(
            worker_state=worker.state,
            session_state=worker.session_state,
            lease_expires_at=worker.session_lease_expires_at,
            now=timezone.now(),
        )

    def get_queryset_for(self, worker):
        return with_current_session(Worker.objects.filter(pk=worker.pk)).first()

    @admin.display(description="administrative state")
    def administrative_state(self, worker):
        return worker.state

    @admin.display(description="live state")
    def live(self, worker):
        return state_badge(self._live(worker))

    @admin.display(description="lease renewed", ordering="session_lease_expires_at")
    def lease_renewed(self, worker):
        """Seconds since the session lease was last extended (a heartbeat writes it at half its
        TTL, ``docs/sessions.md``), and when it lapses."""
        expires = getattr(worker, "session_lease_expires_at", None)
        if expires is None or worker.session_state not in LIVE_SESSION_STATES:
            return "—"
        ttl = db_lease_ttl()
        renewed = (timezone.now() - (expires - ttl)).total_seconds()
        left = (expires - timezone.now()).total_seconds()
        lapse = f"lapsed {age(-left)}" if left < 0 else f"lapses in {int(left)} s"
        return format_html(
            '<span title="lease expires {} UTC">{} s ago · {}</span>',
            f"{expires:%H:%M:%S}",
            int(renewed),
            lapse,
        )

    @admin.display(description="gen / version")
    def generation_version(self, worker):
        if getattr(worker, "session_generation", None) is None:
            return "—"
        return f"{worker.session_generation} / {worker.session_version}"

    @admin.display(description="runs / slots")
    def capacity(self, worker):
        if getattr(worker, "session_max_concurrent_runs", None) is None:
            return "—"
        return f"{worker.active_leases} / {worker.session_max_concurrent_runs}"

    @admin.display(description="labels")
    def labels_summary(self, worker):
        text = getattr(worker, "session_labels", None)
        if not text:
            return "—"
        labels = json.loads(text) if isinstance(text, str) else text
        shown = ", ".join(f"{key}={value}" for key, value in list(labels.items())[:3])
        more = f" +{len(labels) - 3}" if len(labels) > 3 else ""
        full = ", ".join(f"{key}={value}" for key, value in labels.items())
        return format_html('<span title="{}">{}{}</span>', full, shown or "—", more)

    @admin.display(description="agent (policy)")
    def agent_version(self, worker):
        """The newest session's agent version against the version policy (``docs/operators.md``)."""
        software = getattr(worker, "session_software_version", None)
        if not software:
            return "—"
        verdict = version_verdict(software, worker.session_protocol_version)
        if verdict.refused and self._live(worker) in ("online", "draining"):
            return format_html(
                '<span class="ql-state ql-warn" title="minimum {}">{} ({})</span>',
                verdict.minimum or "none",
                software,
                verdict.status,
            )
        return f"{software} ({verdict.status})"

    @admin.display(description="created", ordering="created_at")
    def created(self, worker):
        return when(worker.created_at)

    # --- the detail page ------------------------------------------------------------------------

    def _newest_session(self, worker):
        return worker.sessions.order_by("-generation").first()

    @admin.display(description="current session")
    def current_session(self, worker):
        session = self._newest_session(worker)
        if session is None:
            return "never registered (enroll it, then start qinglong-worker run)"
        url = reverse("admin:workers_workersession_change", args=[session.pk])
        return format_html(
            '<a href="{}">{}</a> {} · generation {} · version {} · {} of {} free · {} (protocol {})<br>'
            "registered {} · lease expires {}{}",
            url,
            short_id(session.pk),
            state_badge(session.state),
            session.generation,
            session.version,
            plural(session.available_slots, "slot"),
            session.max_concurrent_runs,
            session.software_version,
            session.protocol_version,
            when(session.registered_at),
            when(session.lease_expires_at),
            format_html(" · ended {} ({})", when(session.ended_at), session.end_reason or "—")
            if session.ended_at
            else "",
        )

    @admin.display(description="capabilities")
    def capabilities(self, worker):
        session = self._newest_session(worker)
        if session is None:
            return "—"
        return render_capabilities(json.loads(session.capabilities))

    @admin.display(description="current attempts")
    def current_attempts(self, worker):
        attempts = (
            # through the worker's active leases (at most one per attempt): attempts.worker_id has no index
            RunAttempt.objects.filter(
                leases__worker=worker, leases__state=LeaseState.LEASED, worker=worker, state__in=ATTEMPT_LIVE
            )
            .select_related("run__task")
            .defer("stdout_tail", "stderr_tail")
            .order_by("-created_at")[:50]
        )
        rows = [
            (
                reverse("admin:runs_run_change", args=[attempt.run_id]),
                attempt.run.task.name,
                attempt.number,
                attempt.state,
                attempt.lease_generation,
                when(attempt.started_at),
            )
            for attempt in attempts
        ]
        if not rows:
            return "none"
        return format_html(
            '<table class="ql-table"><tr><th>run</th><th>attempt</th><th>state</th><th>lease gen</th>'
            "<th>started</th></tr>{}</table>",
            format_html_join(
                "",
                '<tr><td><a href="{}">{}</a></td><td>#{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
                rows,
            ),
        )

    @admin.display(description="session history")
    def session_history(self, worker):
        sessions = worker.sessions.defer("capabilities").order_by("-generation")[:20]
        rows = [
            (
                reverse("admin:workers_workersession_change", args=[session.pk]),
                session.generation,
                session.version,
                state_badge(session.state),
                session.end_reason or "—",
                when(session.registered_at),
                when(session.ended_at),
                session.software_version,
            )
            for session in sessions
        ]
        if not rows:
            return "none"
        return format_html(
            '<table class="ql-table"><tr><th>generation</th><th>version</th><th>state</th><th>end reason</th>'
            "<th>registered</th><th>ended</th><th>agent</th></tr>{}</table>",
            format_html_join(
                "",
                '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
                "<td>{}</td></tr>",
                rows,
            ),
        )

    @admin.display(description="recent events")
    def recent_events(self, worker):
        events = Event.objects.filter(worker_id=worker.pk).order_by("-created_at")[:10]
        more = reverse("admin:audit_event_changelist") + f"?worker_id={worker.pk}"
        return format_html(
            '{}<p><a href="{}">all events of {}</a></p>',
            event_table(events),
            more,
            worker.name,
        )


def db_lease_ttl() -> timedelta:
    """The session lease TTL (``SESSION_LEASE_SECONDS``)."""
    return timedelta(seconds=protocol().session_lease_seconds)


def render_capabilities(caps: dict) -> str:
    """A capability snapshot as a readable table (arch, os, executors, runtimes, labels, …)."""
    runtimes = ", ".join(f"{r['name']} {r['version']}" for r in caps.get("runtimes", [])) or "—"
    labels = ", ".join(f"{k}={v}" for k, v in caps.get("labels", {}).items()) or "—"
    gpus = (
        ", ".join(
            f"{gpu.get('count', 1)}× {gpu['vendor']} {gpu['memoryMiB']} MiB"
            + (f" ({', '.join(gpu['features'])})" if gpu.get("features") else "")
            for gpu in caps.get("gpus", [])
        )
        or "none"
    )
    rows = [
        ("arch / os", f"{caps.get('arch', '—')} / {caps.get('os', '—')}"),
        ("executors", ", ".join(caps.get("executors", [])) or "—"),
        ("runtimes", runtimes),
        ("labels", labels),
        ("memory / disk", f"{caps.get('memoryMiB', 0):,} MiB / {caps.get('diskMiB', 0):,} MiB"),
        ("CPUs", caps.get("cpuCount", "—")),
        ("GPUs", gpus),
        ("features", ", ".join(caps.get("features", [])) or "—"),
    ]
    return format_html(
        '<table class="ql-table">{}</table>',
        format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
    )


def event_table(events) -> str:
    """Events as a small table: time, kind, actor, run (linked), facts."""
    rows = [
        (
            when(event.created_at),
            event.kind,
            f"{event.actor_type}{': ' + event.actor if event.actor else ''}",
            format_html(
                '<a href="{}">{}</a>',
                reverse("admin:runs_run_change", args=[event.run_id]),
                short_id(event.run_id),
            )
            if event.run_id
            else "—",
            json.dumps(event.data, sort_keys=True) if event.data else "",
        )
        for event in events
    ]
    if not rows:
        return "none"
    return table(("time", "event", "actor", "run", "facts"), rows)


@admin.register(WorkerSession)
class WorkerSessionAdmin(ReadOnlyAdmin):
    list_display = (
        "session",
        "worker",
        "generation",
        "version",
        "state_label",
        "slots",
        "lease_expires",
        "registered",
        "software_version",
        "version_policy",
    )
    list_filter = ("state",)
    list_select_related = ("worker",)
    search_fields = ("worker__name", "=id")
    exclude = ("capabilities",)
    readonly_fields = ("capabilities_readable", "capabilities_pretty")

    def get_queryset(self, request):
        return super().get_queryset(request).defer("capabilities")

    @admin.display(description="session", ordering="id")
    def session(self, session):
        return short_id(session.pk)

    @admin.display(description="state", ordering="state")
    def state_label(self, session):
        if session.state in LIVE_SESSION_STATES and session.lease_expires_at <= timezone.now():
            return format_html("{} {}", state_badge(session.state), state_badge("expired"))
        return state_badge(session.state)

    @admin.display(description="free / max slots")
    def slots(self, session):
        return f"{session.available_slots} / {session.max_concurrent_runs}"

    @admin.display(description="lease expires", ordering="lease_expires_at")
    def lease_expires(self, session):
        return when(session.lease_expires_at)

    @admin.display(description="registered", ordering="registered_at")
    def registered(self, session):
        return when(session.registered_at)

    @admin.display(description="capabilities")
    def capabilities_readable(self, session):
        return render_capabilities(json.loads(session.capabilities))

    @admin.display(description="version policy")
    def version_policy(self, session):
        return version_verdict(session.software_version, session.protocol_version).status

    @admin.display(description="capabilities (canonical JSON)")
    def capabilities_pretty(self, session):
        return format_html(
            '<pre class="ql-pre">{}</pre>', json.dumps(json.loads(session.capabilities), indent=2)
        )


@admin.register(WorkerCredential)
class WorkerCredentialAdmin(ReadOnlyAdmin):
    list_display = (
        "credential",
        "worker",
        "state",
        "fingerprint_short",
        "created",
        "not_after",
        "revoked_at",
    )
    list_filter = ("state",)
    list_select_related = ("worker",)

    @admin.display(description="credential", ordering="id")
    def credential(self, credential):
        return short_id(credential.pk)

    @admin.display(description="fingerprint")
    def fingerprint_short(self, credential):
        return short_id(credential.fingerprint)

    @admin.display(description="created", ordering="created_at")
    def created(self, credential):
        return when(credential.created_at)


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(ReadOnlyAdmin):
    list_display = ("worker", "created", "expires", "used", "used_by_credential")
    list_select_related = ("worker",)
    exclude = ("digest",)

    @admin.display(description="created", ordering="created_at")
    def created(self, token):
        return when(token.created_at)

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, token):
        return when(token.expires_at)

    @admin.display(description="used", ordering="used_at")
    def used(self, token):
        return when(token.used_at)
