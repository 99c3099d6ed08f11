"""Admin helpers shared by the apps: every admin refuses malformed action selections with a
message (never a 500), refuses an action the user may not take with a permission message,
protocol-owned rows are read-only in the admin, and times, ids and counts read the same on every
page (:func:`when`, :func:`short_id`, :func:`plural`). Every action names the permission it needs
(``allowed_permissions``, checked by :func:`permission_check`; ``docs/operators.md``)."""

from datetime import UTC, datetime

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError
from django.db import DataError
from django.http import HttpResponseRedirect
from django.utils import timezone
from django.utils.html import format_html, format_html_join

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

    def get_changelist_instance(self, request):
        """Django's change list, except that a filter value the database cannot take (a year of
        -1 or beyond 64 bits in ``created_at__year``, an ``id__in`` beyond 64 bits) fails when the
        list counts its rows, after Django's own parameter checks: it is answered as Django
        answers a bad lookup (a redirect to ``?e=1``), not with a 500."""
        try:
            return super().get_changelist_instance(request)
        except (ValueError, OverflowError, DataError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class ModelAdmin(RefuseUnpermittedActions, admin.ModelAdmin):
    """Django's ``ModelAdmin``, except that an action posted with a selected id that is not a
    valid primary key (``_selected_action=not-a-uuid``) is refused with an error message and
    nothing done, instead of failing with a 500 when the selection is evaluated; and an action
    the user lacks the permission for is refused with a message naming it (Django would only
    say "No action selected")."""

    def get_actions(self, request):
        """Actions that declare no ``allowed_permissions`` need the model's standard change
        permission (``<app>.change_<model>``): a view-only user sees no state-changing control.
        Actions that declare permissions are left to Django's own check."""
        actions = super().get_actions(request)
        codename = f"{self.opts.app_label}.change_{self.opts.model_name}"
        if request.user.has_perm(codename):
            return actions
        return {
            name: entry for name, entry in actions.items() if getattr(entry[0], "allowed_permissions", None)
        }

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
        response = super().response_action(request, queryset)
        # An action run from an object's own page (templates/admin/ql_change_form.html) returns there.
        back = request.POST.get("_ql_next", "")
        if isinstance(response, HttpResponseRedirect) and back.startswith("/admin/") and "//" not in back:
            return HttpResponseRedirect(back)
        return response


class ReadOnlyAdmin(ModelAdmin):
    """Rows written only by services (sessions, leases, attempts, events): view, never edit."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def when(value: datetime | None, *, now: datetime | None = None) -> str:
    """A time for people: the operator's timezone to the second, its age, and UTC on hover.

    ``now``: what the age is measured from (default: this process's clock, good enough for a
    page). ``—`` for no time.
    """
    if value is None:
        return "—"
    utc = value.astimezone(UTC)
    local = timezone.localtime(value)
    seconds = ((now or timezone.now()) - value).total_seconds()
    return format_html(
        '<time datetime="{}" title="{} UTC">{}</time> <span class="ql-age">{}</span>',
        utc.isoformat(),
        f"{utc:%Y-%m-%d %H:%M:%S}",
        f"{local:%Y-%m-%d %H:%M:%S}",
        age(seconds),
    )


def age(seconds: float) -> str:
    """``12 s ago``, ``in 4 s``, ``3 min 5 s ago``, ``2 h 10 min ago``, ``4 d ago``."""
    past = seconds >= 0
    seconds = int(abs(seconds))
    if seconds < 120:
        text = f"{seconds} s"
    elif seconds < 7200:
        text = f"{seconds // 60} min {seconds % 60} s"
    elif seconds < 172800:
        text = f"{seconds // 3600} h {seconds % 3600 // 60} min"
    else:
        text = f"{seconds // 86400} d"
    return f"{text} ago" if past else f"in {text}"


def short_id(value) -> str:
    """A UUID (or any long id) as ``…`` and its last 8 characters (UUIDv7s made in the same
    millisecond share their first 12), the full value on hover and copied on click."""
    if value is None or value == "":
        return "—"
    text = str(value)
    shown = f"…{text[-8:]}" if len(text) > 9 else text
    return format_html('<span class="ql-id" title="{}" data-copy="{}">{}</span>', text, text, shown)


def plural(count: int, singular: str, many: str | None = None) -> str:
    """``1 slot``, ``2 slots``, ``0 slots``."""
    return f"{count} {singular if count == 1 else (many or singular + 's')}"


def table(headers, rows) -> str:
    """A small HTML table (``ql-table``): a header row, then one row per tuple; cells escaped."""
    head = format_html_join("", "<th>{}</th>", ((header,) for header in headers))
    body = format_html_join(
        "", "<tr>{}</tr>", ((format_html_join("", "<td>{}</td>", ((cell,) for cell in row)),) for row in rows)
    )
    return format_html('<table class="ql-table"><tr>{}</tr>{}</table>', head, body)


class ActionWritesAdmin(ModelAdmin):
    """An admin whose saves and deletes call write paths (``actions``), each its own durable
    transaction: the add/change and delete views do not wrap them in Django's outer
    transaction (a durable transaction cannot be nested)."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return self._changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        return self._delete_view(request, object_id, extra_context)
