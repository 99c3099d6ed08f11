"""Browser tests: Playwright for Python driving Debian's chromium (never a downloaded browser)
against a live server. Screenshots of every page a test visits land in var/screenshots/.

Without chromium the tests skip, except under ``CI=true`` where that fails (``make chromium``
installs it; ``make test`` depends on it)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.db import connections
from playwright.sync_api import sync_playwright

from tests.console.fixtures import PASSWORD, make_user

# Playwright's sync API runs an event loop in this thread; the test's own ORM calls are still
# plain synchronous calls between page steps.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = Path(os.environ.get("QINGLONG_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
CI = os.environ.get("CI", "").lower() == "true"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser_context(tmp_path):
    """A fresh headless chromium (its own user-data-dir) with a 1280×900 window."""
    if not CHROMIUM.exists():
        if CI:
            pytest.fail(f"{CHROMIUM} is missing under CI=true (make chromium installs it)")
        pytest.skip(f"{CHROMIUM} is missing (make chromium installs it)")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 1280, "height": 900},
            timezone_id="Europe/Berlin",
        )
        context.set_default_timeout(20_000)
        try:
            yield context
        finally:
            for page in context.pages:  # stop the pages' own polling before the server goes
                page.goto("about:blank")
            context.close()
            # With Playwright's loop running, asgiref gives this test its own connection objects;
            # close them here, or the test database cannot be dropped at the end of the session.
            connections.close_all()


class Console:
    """One browser tab logged in to the console as ``role``; ``shot`` saves a screenshot."""

    def __init__(self, context, base_url: str, role: str) -> None:
        self.page = context.new_page()
        self.base = base_url
        self.role = role

    def login(self) -> Console:
        self.page.context.clear_cookies()  # one role at a time in this browser
        self.page.goto(self.base + "/admin/login/?next=/admin/")
        self.page.fill("#id_username", self.role)
        self.page.fill("#id_password", PASSWORD)
        self.page.click("input[type=submit]")
        self.page.wait_for_selector("#ql-dashboard")
        return self

    def go(self, path: str):
        answer = self.page.goto(self.base + path)
        assert answer is not None and answer.status < 500, (path, answer and answer.status)
        return answer

    def shot(self, name: str) -> Path:
        """Screenshot the whole page as var/screenshots/<name>.png; also check it fits 1280 px."""
        return shot(self.page, name)


def shot(page, name: str) -> Path:
    """Screenshot ``page`` whole as var/screenshots/<name>.png and assert it fits 1280 px."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    target = SCREENSHOTS / f"{re.sub(r'[^a-z0-9-]+', '-', name.lower())}.png"
    page.screenshot(path=str(target), full_page=True)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280, f"{page.url} is {width} px wide at 1280 px"
    return target


@pytest.fixture
def console(browser_context, live_server):
    """``console("admin")``: a logged-in tab for a new user of that role."""

    def open_as(role: str) -> Console:
        make_user(role)
        return Console(browser_context, live_server.url, role).login()

    return open_as
