"""Admin helpers shared by the apps: every admin refuses malformed action selections with a
message (never a 500), protocol-owned rows are read-only in the admin, and times, ids and counts
read the same on every page (:func:`when`, :func:`short_id`, :func:`plural`)."""

from datetime import UTC, datetime

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.http import HttpResponseRedirect
from django.utils import timezone
from django.utils.html import format_html, format_html_join


class ModelAdmin(admin.ModelAdmin):
    """Django's ``ModelAdmin``, except that an action posted with a selected id that is not a
    valid primary key (``_selected_action=not-a-uuid``) is refused with an error message and
    nothing done, instead of failing with a 500 when the selection is evaluated."""

    def get_actions(self, request):
        """Actions that declare no ``allowed_permissions`` need the model's standard change
        permission (``<app>.change_<model>``): a view-only user sees no state-changing control.
        Actions that declare permissions are left to Django's own check."""
        actions = super().get_actions(request)
        codename = f"{self.opts.app_label}.change_{self.opts.model_name}"
        if request.user.has_perm(codename):
            return actions
        return {
            name: entry
            for name, entry in actions.items()
            if getattr(entry[0], "allowed_permissions", None) and name != "delete_selected"
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
