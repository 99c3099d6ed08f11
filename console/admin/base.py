"""Admin helpers shared by the apps: every admin refuses malformed action selections with a
message (never a 500), refuses an action the user may not take with a permission message,
and protocol-owned rows are read-only in the admin. Every action names the permission it needs
(``allowed_permissions``, checked by :func:`permission_check`; ``docs/operators.md``)."""

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.http import HttpResponseRedirect

from accounts.roles import role_of


def permission_check(codename: str):
    """A ``has_<codename>_permission`` method for ``allowed_permissions = ("<codename>",)``:
    the user holds ``<app_label>.<codename>`` of the admin's model (a superuser holds all)."""

    def check(self, request, obj=None) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    check.__name__ = f"has_{codename}_permission"
    return check


def acting_role(request) -> str:
    """The role an admin user's act is audited under (``accounts.roles.role_of``)."""
    return role_of(request.user)


class RefuseUnpermittedActions:
    """Mixed into every admin (Django's user and group admins too): an action the user may not
    take is refused by name before anything runs."""

    def changelist_view(self, request, extra_context=None):
        # Django leaves a refused action out of the form and then says nothing useful (or, with
        # no action left at all, ignores the POST): refuse it here, by name, before anything runs.
        name = request.POST.get("action", "") if request.method == "POST" else ""
        declared = {getattr(action, "__name__", action) for action in self.actions or ()}
        declared |= {site_action for site_action, _ in self.admin_site.actions}
        if (
            name in declared
            and self.has_view_or_change_permission(request)
            and name not in self.get_actions(request)
        ):
            self.message_user(
                request,
                f"You do not have permission to {name.replace('_', ' ')}; nothing was done.",
                messages.ERROR,
            )
            return HttpResponseRedirect(request.get_full_path())
        return super().changelist_view(request, extra_context)


class ModelAdmin(RefuseUnpermittedActions, admin.ModelAdmin):
    """Django's ``ModelAdmin``, except that an action posted with a selected id that is not a
    valid primary key (``_selected_action=not-a-uuid``) is refused with an error message and
    nothing done, instead of failing with a 500 when the selection is evaluated; and an action
    the user lacks the permission for is refused with a message naming it (Django would only
    say "No action selected")."""

    def response_action(self, request, queryset):
        pk = self.model._meta.pk
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                pk.to_python(value)
            except ValidationError:
                self.message_user(
                    request,
                    f"{value!r} is not a valid {self.model._meta.verbose_name} id; nothing was done.",
                    messages.ERROR,
                )
                return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset)


class ReadOnlyAdmin(ModelAdmin):
    """Rows written only by services (sessions, leases, attempts, events): view, never edit."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ActionWritesAdmin(ModelAdmin):
    """An admin whose saves and deletes call write paths (``actions``), each its own durable
    transaction: the add/change and delete views do not wrap them in Django's outer
    transaction (a durable transaction cannot be nested)."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return self._changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        return self._delete_view(request, object_id, extra_context)
