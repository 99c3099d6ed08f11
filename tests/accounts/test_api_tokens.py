"""API tokens (issue 11): created in the admin and shown once, never readable afterwards,
expiring, role-scoped (never beyond the user's own role), revoked by deleting — each audited."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command

from accounts.models import ApiToken
from audit.models import Event
from tests.helpers import api_token, operator_user

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/ops/runs"


def _create_in_admin(client, user, role: str):
    return client.post(
        "/admin/accounts/apitoken/add/",
        {"user": str(user.pk), "name": "ci-deploy", "role": role, "ttl_days": "7"},
        follow=True,
    )


def test_a_token_is_shown_once_at_creation_and_never_again(client):
    admin_user = operator_user("boss", role="admin")
    holder = operator_user("ci", role="operator")
    client.force_login(admin_user)

    answer = _create_in_admin(client, holder, "operator")

    shown = re.findall(r"qlops_[0-9a-f]{64}", answer.content.decode())
    assert len(set(shown)) == 1, answer.content.decode()[-2000:]
    token = shown[0]
    assert client.get(RUNS, headers={"Authorization": f"Token {token}"}).status_code == 200
    stored = ApiToken.objects.get(name="ci-deploy")
    assert (stored.user, stored.role) == (holder, "operator")
    for page in ("/admin/accounts/apitoken/", f"/admin/accounts/apitoken/{stored.pk}/change/"):
        text = client.get(page).content.decode()
        assert token not in text and token[:15] not in text  # (the digest is the row id in its URLs)
    event = Event.objects.get(kind="api_token.created")
    assert (event.actor, event.data["token_role"], event.data["role"]) == ("boss", "operator", "admin")
    assert token not in str(list(Event.objects.values()))


def test_a_token_never_exceeds_its_users_role(client):
    client.force_login(operator_user("boss", role="admin"))
    viewer = operator_user("looker", role="viewer")
    answer = _create_in_admin(client, viewer, "admin")
    assert "does not hold the admin role" in answer.content.decode()
    assert not ApiToken.objects.exists() and not Event.objects.filter(kind="api_token.created").exists()
    assert "qlops_" not in answer.content.decode()


def test_deleting_a_token_revokes_it_and_is_audited(client):
    holder = operator_user("ci", role="operator")
    token = api_token(holder, role="operator")
    headers = {"Authorization": f"Token {token}"}
    assert client.get(RUNS, headers=headers).status_code == 200
    client.force_login(operator_user("boss", role="admin"))
    digest = ApiToken.objects.get().digest

    answer = client.post(
        "/admin/accounts/apitoken/",
        {"action": "delete_selected", "_selected_action": [digest], "index": "0", "post": "yes"},
        follow=True,
    )

    assert answer.status_code == 200 and not ApiToken.objects.exists()
    assert client.get(RUNS, headers=headers).status_code == 401
    event = Event.objects.get(kind="api_token.revoked")
    assert (event.actor, event.data) == ("boss", {"for": "ci", "token_role": "operator", "role": "admin"})


def test_an_operator_cannot_see_or_make_tokens_nor_an_admin_make_itself_superuser(client):
    client.force_login(operator_user("ops", role="operator"))
    assert client.get("/admin/accounts/apitoken/").status_code == 403
    assert client.get("/admin/accounts/apitoken/add/").status_code == 403
    boss = operator_user("boss", role="admin")
    root = operator_user("root", superuser=True)
    client.force_login(boss)
    page = client.get(f"/admin/auth/user/{boss.pk}/change/").content.decode()
    assert 'name="is_superuser"' not in page and 'name="user_permissions"' not in page
    root_page = client.get(f"/admin/auth/user/{root.pk}/change/")
    assert root_page.status_code == 200 and 'name="_save"' not in root_page.content.decode()  # view only
    taken = client.post(
        f"/admin/auth/user/{root.pk}/password/",
        {"password1": "a-new-pass-1234", "password2": "a-new-pass-1234"},
    )
    assert taken.status_code == 403
    root.refresh_from_db()
    assert root.check_password("correct horse battery")


def test_create_operator_prints_a_working_token_once(client, capsys):
    call_command("create_operator", "launcher-admin")
    printed = dict(part.split("=", 1) for part in capsys.readouterr().out.split())
    assert printed["token"].startswith("qlops_")
    assert client.get(RUNS, headers={"Authorization": f"Token {printed['token']}"}).status_code == 200
    assert printed["token"] not in str(list(ApiToken.objects.values()))
