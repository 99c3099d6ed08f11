"""Operators' worker management: enroll, drain, revoke, rotate; sessions and credentials read-only."""

import json

from django.contrib import admin, messages
from django.utils.html import format_html

from actions.credentials import credential_force_rotation
from actions.enrollment import enrollment_token_create, worker_create
from actions.sessions.shutdown import session_operator_offline
from actions.workers import worker_drain, worker_revoke, worker_undrain
from console.admin.base import ActionWritesAdmin, ReadOnlyAdmin, acting_role, permission_check
from core.errors import DomainError
from workers.models import LIVE_SESSION_STATES, EnrollmentToken, Worker, WorkerCredential, WorkerSession
from workers.versions import version_verdict


def _each(modeladmin, request, queryset, action, verb):
    for worker in queryset:
        try:
            action(worker_id=worker.pk, actor=request.user.get_username(), role=acting_role(request))
        except DomainError as exc:
            modeladmin.message_user(request, f"{worker.name}: {exc.code}: {exc.message}", messages.ERROR)
        else:
            modeladmin.message_user(request, f"{worker.name}: {verb}", messages.SUCCESS)


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
        modeladmin.message_user(
            request,
            format_html(
                "{}: enrollment token (single use, shown only now, expires {} UTC):<br><code>{}</code><br>"
                "on the machine: <code>qinglong-worker enroll --server {} --token {}</code>",
                worker.name,
                f"{issued.record.expires_at:%Y-%m-%d %H:%M}",
                issued.token,
                request.build_absolute_uri("/").rstrip("/"),
                issued.token,
            ),
            messages.WARNING,
        )


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


@admin.register(Worker)
class WorkerAdmin(ActionWritesAdmin):
    list_display = ("name", "state", "live_session", "agent_version", "created_at")
    list_filter = ("state",)
    search_fields = ("name",)
    fields = (
        "name",
        "description",
        "state",
        "drain_requested_at",
        "revoked_at",
        "rotation_required",
        "created_at",
    )
    readonly_fields = ("state", "drain_requested_at", "revoked_at", "rotation_required", "created_at")
    actions = (issue_enrollment_token, drain, undrain, revoke, force_offline, force_rotation)
    has_issue_enrollment_token_permission = permission_check("issue_enrollment_token")
    has_drain_worker_permission = permission_check("drain_worker")
    has_revoke_worker_permission = permission_check("revoke_worker")
    has_force_offline_worker_permission = permission_check("force_offline_worker")
    has_rotate_worker_credential_permission = permission_check("rotate_worker_credential")

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields + (("name",) if obj else ())

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["description"])
        else:
            created = worker_create(
                name=obj.name,
                description=obj.description,
                actor=request.user.get_username(),
                role=acting_role(request),
            )
            obj.pk = created.pk
            obj.state = created.state
            obj.created_at = created.created_at

    @admin.display(description="live session")
    def live_session(self, worker):
        session = worker.sessions.filter(state__in=LIVE_SESSION_STATES).first()
        if session is None:
            return "—"
        return (
            f"gen {session.generation} v{session.version} {session.state} ({session.available_slots} slots)"
        )

    @admin.display(description="agent version (policy)")
    def agent_version(self, worker):
        session = worker.sessions.filter(state__in=LIVE_SESSION_STATES).first()
        if session is None:
            return "—"
        verdict = version_verdict(session.software_version, session.protocol_version)
        return f"{session.software_version} ({verdict.status})"

    def has_delete_permission(self, request, obj=None):
        return False  # a worker is revoked, never deleted: its sessions and attempts point at it


@admin.register(WorkerSession)
class WorkerSessionAdmin(ReadOnlyAdmin):
    list_display = (
        "worker",
        "generation",
        "version",
        "state",
        "available_slots",
        "max_concurrent_runs",
        "lease_expires_at",
        "registered_at",
        "software_version",
        "version_policy",
    )
    list_filter = ("state",)
    list_select_related = ("worker",)
    search_fields = ("worker__name", "=id")
    exclude = ("capabilities",)
    readonly_fields = ("capabilities_pretty",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("capabilities")

    @admin.display(description="version policy")
    def version_policy(self, session):
        return version_verdict(session.software_version, session.protocol_version).status

    @admin.display(description="capabilities (canonical)")
    def capabilities_pretty(self, session):
        return format_html("<pre>{}</pre>", json.dumps(json.loads(session.capabilities), indent=2))


@admin.register(WorkerCredential)
class WorkerCredentialAdmin(ReadOnlyAdmin):
    list_display = ("id", "worker", "state", "fingerprint", "created_at", "not_after", "revoked_at")
    list_filter = ("state",)
    list_select_related = ("worker",)


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(ReadOnlyAdmin):
    list_display = ("worker", "created_at", "expires_at", "used_at", "used_by_credential")
    list_select_related = ("worker",)
    exclude = ("digest",)
