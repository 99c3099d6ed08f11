"""API tokens and users in the admin (``docs/operators.md`` Roles, Tokens).

A token is shown once, in the message after it is created; the list shows its name, owner,
role and expiry, never the token or its digest. Deleting a token revokes it (audited). A user
who is not a superuser cannot grant superuser status or single permissions, nor change a
superuser: roles are given through the groups.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.http import HttpResponseRedirect
from django.utils import timezone
from django.utils.html import format_html

from accounts.models import ApiToken
from accounts.roles import holds_role
from actions.tokens import MAX_TTL_SECONDS, api_token_create, api_token_revoke
from console.admin.base import ActionWritesAdmin, RefuseUnpermittedActions, acting_role
from core.errors import DomainError


class ApiTokenForm(forms.ModelForm):
    ttl_days = forms.IntegerField(
        label="lifetime (days)", min_value=1, max_value=MAX_TTL_SECONDS // 86400, initial=30
    )

    class Meta:
        model = ApiToken
        fields = ("user", "name", "role")

    def clean(self):
        data = super().clean()
        user, role = data.get("user"), data.get("role")
        if user is not None and role and not holds_role(user, role):
            self.add_error("role", f"{user.get_username()} does not hold the {role} role")
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(ActionWritesAdmin):
    form = ApiTokenForm
    list_display = ("name", "user", "role", "created", "expiry", "expired")
    list_filter = ("role",)
    list_select_related = ("user",)
    search_fields = ("name", "user__username")
    exclude = ("digest", "token_key")

    @admin.display(boolean=True, description="expired")
    def expired(self, token):
        return token.expiry is not None and token.expiry <= timezone.now()

    def has_change_permission(self, request, obj=None):
        return False  # a token is never edited: revoke it and create another

    def save_model(self, request, obj, form, change):
        try:
            issued = api_token_create(
                user=form.cleaned_data["user"],
                name=form.cleaned_data["name"],
                role=form.cleaned_data["role"],
                ttl_seconds=form.cleaned_data["ttl_days"] * 86400,
                actor=request.user.get_username(),
                actor_role=acting_role(request),
            )
        except DomainError as exc:
            # The form validated shapes; the action refuses a role the user does not hold.
            self.message_user(request, f"{exc.field}: {exc.message}; no token was created.", messages.ERROR)
            obj.digest = ""
            return
        obj.digest, obj.token_key, obj.created, obj.expiry = (
            issued.record.digest,
            issued.record.token_key,
            issued.record.created,
            issued.record.expiry,
        )
        self.message_user(
            request,
            format_html(
                "API token {} ({} role, expires {} UTC), shown only now:<br><code>{}</code>",
                issued.record.name,
                issued.record.role,
                f"{issued.record.expiry:%Y-%m-%d %H:%M}",
                issued.token,
            ),
            messages.WARNING,
        )

    def response_add(self, request, obj, post_url_continue=None):
        if not obj.digest:  # the action refused it (its message says why)
            return HttpResponseRedirect(request.path)
        return super().response_add(request, obj, post_url_continue)

    def log_addition(self, request, obj, message):
        if obj.digest:  # not when the action refused it
            super().log_addition(request, obj, message)

    def delete_model(self, request, obj):
        api_token_revoke(
            digest=obj.digest, actor=request.user.get_username(), actor_role=acting_role(request)
        )

    def delete_queryset(self, request, queryset):
        for digest in queryset.values_list("digest", flat=True):
            api_token_revoke(
                digest=digest, actor=request.user.get_username(), actor_role=acting_role(request)
            )


User = get_user_model()
admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(Group)
class RoleGroupAdmin(RefuseUnpermittedActions, GroupAdmin):
    """Django's group admin; the role groups are kept by migrations (``accounts.roles``)."""


@admin.register(User)
class OperatorUserAdmin(RefuseUnpermittedActions, UserAdmin):
    """Django's user admin; only a superuser grants superuser status or single permissions, or
    changes a superuser. Give roles with the groups ``viewer``, ``operator``, ``admin``."""

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields += ("is_superuser", "user_permissions")
        return fields

    def has_change_permission(self, request, obj=None):
        if obj is not None and obj.is_superuser and not request.user.is_superuser:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser and super().has_delete_permission(request, obj)
