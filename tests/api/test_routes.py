"""No endpoint a worker can reach exists without the transport's protections (ADR-0012 §1):
every worker route is a signed, rate-limited, principal-bound ``WorkerAPIView`` with a body
limit (enrollment, the one unsigned route, is rate limited per address and size limited); every
operator route is an ``OperatorAPIView`` naming an existing permission for each of its methods."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.urls import URLPattern, URLResolver, get_resolver

from api.auth import WorkerSignatureAuthentication
from api.base import OperatorAPIView, WorkerAPIView
from api.workers.views import EnrollView


def routes(patterns=None, prefix: str = ""):
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(entry, URLResolver):
            yield from routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield "/" + prefix + str(entry.pattern), getattr(entry.callback, "cls", None)


def test_every_worker_route_is_protected():
    worker_routes = {path: view for path, view in routes() if path.startswith("/api/v1/worker/")}
    assert len(worker_routes) >= 13
    for path, view in worker_routes.items():
        if view is EnrollView:
            assert view.authentication_classes == [] and view.max_body_bytes <= 4096
            continue
        assert view is not None and issubclass(view, WorkerAPIView), path
        assert view.authentication_classes == [WorkerSignatureAuthentication], path
        assert view.http_method_names == ["post", "options"], path
        # Within the server's own cap (RequestGuard), which refuses anything larger before Django.
        assert 0 < view.max_body_bytes <= settings.QINGLONG_SERVER["MAX_BODY_BYTES"], path
        assert view.max_json_depth <= 8, path
        assert "initial" not in vars(view), f"{path} must not bypass WorkerAPIView.initial"


@pytest.mark.django_db
def test_every_operator_route_names_a_permission_for_each_method():
    operator_routes = {path: view for path, view in routes() if path.startswith("/api/v1/ops/")}
    assert operator_routes
    for path, view in operator_routes.items():
        assert view is not None and issubclass(view, OperatorAPIView), path
        assert view.authentication_classes == OperatorAPIView.authentication_classes, path
        # The operator check first; a view may add finer ones after it (schedules: model permissions).
        base = OperatorAPIView.permission_classes
        assert view.permission_classes[: len(base)] == base, path
        handlers = {m.upper() for m in view.http_method_names if m != "options" and hasattr(view, m)}
        if not getattr(view, "permissions", None):
            continue  # a view guarded by model permissions (schedules) names none of its own
        assert handlers <= set(view.permissions), (path, handlers, view.permissions)
        for permission in view.permissions.values():
            app_label, codename = permission.split(".")
            assert Permission.objects.filter(content_type__app_label=app_label, codename=codename).exists(), (
                path,
                permission,
            )
