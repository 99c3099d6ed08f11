"""The issue's walk, done from outside (issue 11 acceptance): a view-only staff user, over real
HTTP against a real ``manage.py serve`` on a fresh database, logs in to the admin, opens every
list and every object page, tries every worker, task and run action and every state-changing
operator API call — and changes nothing, and never sees a usable enrollment or API token."""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest
from django.contrib import admin

from tests.accounts.test_permission_matrix import ADMIN_ACTS, API_ACTS
from tests.accounts.world import build_world, changed_tables, fingerprint, token_of, user_in
from tests.agent.processes import ControlPlane
from tests.helpers import api_token, operator_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: What a usable secret looks like: an enrollment token or an API token.
SECRET = re.compile(r"qlenroll_[A-Za-z0-9_-]{20,}|qlops_[0-9a-f]{20,}")


class Browser:
    """A cookie-keeping HTTP client that posts forms with Django's CSRF token."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def request(self, method: str, path: str, data: bytes | None = None, headers: dict | None = None):
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers or {})
        try:
            with self.opener.open(request, timeout=15) as answer:
                return answer.status, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode(errors="replace")

    def csrf(self) -> str:
        return next(c.value for c in self.jar if c.name == "csrftoken")

    def form(self, path: str, fields: dict) -> tuple[int, str]:
        self.request("GET", path)
        body = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": self.csrf()}, doseq=True).encode()
        return self.request(
            "POST",
            path,
            body,
            {"Content-Type": "application/x-www-form-urlencoded", "Referer": self.base + path},
        )


def test_a_view_only_staff_user_changes_nothing_and_sees_no_usable_token(tmp_path):
    world = build_world()
    api_token(operator_user("someone-else", role="admin"), role="admin")  # a token that exists
    viewer = user_in("viewer")
    viewer.set_password("correct horse battery")
    viewer.save(update_fields=["password"])
    token = token_of(viewer, "viewer")
    targets = {key: target(world) for key, (_, target) in ADMIN_ACTS.items()}
    plane = ControlPlane(tmp_path)
    plane.start()
    try:
        browser = Browser(plane.url)
        status, page = browser.form(
            "/admin/login/?next=/admin/",
            {"username": viewer.username, "password": "correct horse battery", "next": "/admin/"},
        )
        assert status == 200 and "Log out" in page, page[-800:]
        before = fingerprint()  # logging in sets last_login; from here on nothing may change
        seen: list[str] = []
        for model in admin.site._registry:
            url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
            status, page = browser.request("GET", url)
            seen.append(page)
            for object_id in sorted(set(re.findall(re.escape(url) + r"([^/\"]+)/change/", page)))[:5]:
                seen.append(browser.request("GET", f"{url}{object_id}/change/")[1])
        for (label, action), pk in targets.items():
            app_label, model_name = label.split(".")
            fields = {"action": action, "_selected_action": str(pk), "index": "0", "post": "yes"}
            status, page = browser.form(f"/admin/{app_label}/{model_name}/", fields)
            assert status == 403 or "You do not have permission" in page, (label, action, status)
            seen.append(page)
        headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        for name, path, body, _ in API_ACTS:
            status, answer = browser.request("POST", path(world), json.dumps(body(world)).encode(), headers)
            assert (status, json.loads(answer)["code"]) == (403, "permission_denied"), name
        for path in ("workers", "sessions", "audit", "runs", "tasks"):
            status, answer = browser.request("GET", f"/api/v1/ops/{path}", headers=headers)
            assert status == 200, path
            seen.append(answer)
        after = fingerprint()
    finally:
        plane.stop()
    assert changed_tables(before, after) == []
    leaked = [match for page in seen for match in SECRET.findall(page)]
    assert leaked == [] and len(seen) > 20
