"""Admin helpers shared by the apps: every admin refuses malformed action selections with a
message (never a 500), and protocol-owned rows are read-only in the admin."""

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.http import HttpResponseRedirect


class ModelAdmin(admin.ModelAdmin):
    """Django's ``ModelAdmin``, except that an action posted with a selected id that is not a
    valid primary key (``_selected_action=not-a-uuid``) is refused with an error message and
    nothing done, instead of failing with a 500 when the selection is evaluated."""

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
