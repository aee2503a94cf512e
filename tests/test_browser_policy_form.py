"""The output policy's change form at 1280x800: the common edit in about two screens (it was
4,396 px tall), rarely used fields folded and opened by a click or by an error in them."""

import uuid

import pytest
from playwright.sync_api import expect

from tests.a11y import axe_context, serious_violations

pytestmark = pytest.mark.browser

PASSWORD = "policy-form-pass-phrase-42"
SEED = """
from django.contrib.auth.models import User
User.objects.create_superuser({name!r}, password={password!r})
"""
# Two screens at 1280x800, and some room for the history and regression rows a policy gathers.
TALLEST = 2 * 800 + 400


def test_the_policy_form_fits_in_about_two_screens_and_unfolds(browser, daphne_server):
    name = f"pf{uuid.uuid4().hex[:6]}"
    daphne_server.manage("shell", "-c", SEED.format(name=name, password=PASSWORD))
    context = axe_context(browser)
    page = context.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        page.goto(daphne_server.url + "/admin/login/?next=/admin/chat/outputpolicy/")
        page.fill("#id_username", name)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.locator("#result_list tbody th a").first.click()
        expect(page.locator("#id_system_prompt")).to_be_visible()
        height = page.evaluate("document.documentElement.scrollHeight")
        print(f"policy change form at 1280x800: {height} px")
        assert height <= TALLEST, height
        # The common edit is open; the rest is one click away.
        for field in ("name", "description", "mode", "max_new_tokens", "temperature"):
            expect(page.locator(f"#id_{field}")).to_be_visible()
        expect(page.locator("#id_json_schema")).to_have_attribute("rows", "3")
        expect(page.locator("#id_top_p")).to_be_hidden()
        page.get_by_text("Sampling, examples and stopping").click()
        expect(page.locator("#id_top_p")).to_be_visible()
        expect(page.locator("#id_fallback_text")).to_be_hidden()
        found = serious_violations(page)
        assert found == [], [(v["id"], v["nodes"]) for v in found]

        # A folded field with an error opens its fold when the save is refused.
        page.get_by_text("Checks before anyone sees the answer").click()
        page.fill("#id_max_retries", "-1")
        page.get_by_text("Checks before anyone sees the answer").click()  # folded again
        expect(page.locator("#id_max_retries")).to_be_hidden()
        page.locator("input[name=_continue]").click()
        expect(page.locator(".errornote")).to_be_visible()
        expect(page.locator("#id_max_retries")).to_be_visible()
        expect(page.locator(".field-max_retries .errorlist, .fieldBox.errors")).not_to_have_count(0)
    finally:
        context.close()
