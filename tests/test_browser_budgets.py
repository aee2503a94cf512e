"""Budgets in Chromium: the page says in words that the daily budget is spent and when it
resets; the usage pages (the user's, from the account menu, and the admin's) with screenshots
for docs/using.md (`DOCS_SCREENSHOTS=1` writes them to docs/)."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat
from tests.test_browser_screenshots import PASSWORD, ask, target

pytestmark = pytest.mark.browser

MAKE_STAFF = """
from django.contrib.auth import get_user_model
get_user_model().objects.create_superuser({name!r}, password={password!r})
"""


def sign_up(page, server, name: str) -> None:
    page.goto(server.url + "/accounts/signup/")
    page.fill("#id_username", name)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")


def test_a_spent_budget_is_said_in_words_and_the_usage_pages_show_it(browser, daphne_server):
    server = daphne_server
    server.manage("budget", "reconcile")  # counters an earlier run left on this Redis
    name = f"bea{uuid.uuid4().hex[:6]}"
    context = browser.new_context(viewport={"width": 1100, "height": 760}, color_scheme="light")
    page = context.new_page()
    try:
        sign_up(page, server, name)
        server.manage(
            "budget", "set", "--user", name, "--daily-answers", "2", "--monthly-tokens", "5000"
        )
        open_chat(page, server)
        ask(page, "What is the capital of France?")
        ask(page, "Name a colour.")
        expect(page.locator(".message.assistant").last).to_have_attribute("data-state", "done")
        ask(page, "Name a fruit.")
        refused = page.locator(".message.assistant").last
        expect(refused).to_have_attribute("data-state", "error")
        expect(refused.locator(".error-message")).to_have_text(
            "your daily budget is spent; it resets at 00:00 UTC"
        )
        expect(refused.locator(".code")).to_have_text("quota_exceeded")

        page.click("#account-usage")
        expect(page.locator("h1")).to_have_text("Usage")
        spent = page.locator("#budgets tr.spent")
        expect(spent).to_have_count(1)
        expect(spent).to_contain_text("daily answers")
        expect(page.locator("#usage tbody tr")).to_have_count(1)
        expect(page.locator("#usage tbody tr td").nth(3)).to_have_text("2")
        page.screenshot(path=str(target() / "screenshot-usage.png"), full_page=True)

        staff = f"admin{uuid.uuid4().hex[:6]}"
        server.manage("shell", "-c", MAKE_STAFF.format(name=staff, password=PASSWORD))
        admin = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
        desk = admin.new_page()
        desk.goto(server.url + "/admin/login/?next=/admin/")
        desk.fill("#id_username", staff)
        desk.fill("#id_password", PASSWORD)
        desk.click("input[type=submit]")
        desk.click("#report-usage")
        expect(desk.locator("#chart-tokens-title")).to_be_visible()
        expect(desk.locator("#usage-rows tbody tr", has_text=name)).to_have_count(1)
        desk.fill("input[name=user]", name)
        desk.click("input[type=submit]")
        expect(desk.locator("#total-answers")).to_have_text("2")
        expect(desk.locator("#usage-csv")).to_have_attribute("href", re.compile("format=csv"))
        desk.screenshot(path=str(target() / "screenshot-admin-usage.png"), full_page=True)
        admin.close()
    finally:
        context.close()
