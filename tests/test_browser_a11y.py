"""axe-core in Chromium on the chat (empty, with an answer), sign-in and sign-up: no serious or
critical violation. The resumed chat is checked in tests/test_browser_resume.py."""

import pytest
from playwright.sync_api import expect

from tests.a11y import serious_violations
from tests.test_browser import open_chat
from tests.test_browser_answers import short_policy

pytestmark = pytest.mark.browser


def test_the_chat_empty_and_with_an_answer_has_no_serious_violation(axe_page, daphne_server):
    """The empty chat, then the same chat with a finished answer and the sidebar's day
    headings (where a list once held an item that was not one)."""
    page = axe_page
    short_policy(daphne_server)
    open_chat(page, daphne_server)
    assert serious_violations(page) == []
    page.select_option("#policy", "short")
    page.fill("#prompt", "Say hello.")
    page.keyboard.press("Enter")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    expect(page.locator("#conversations .day-label").first).to_be_visible()
    assert serious_violations(page) == []


@pytest.mark.parametrize("path", ["/accounts/login/", "/accounts/signup/"])
def test_sign_in_and_sign_up_have_no_serious_violation(axe_page, daphne_server, path):
    """The account forms as a visitor first sees them."""
    axe_page.goto(daphne_server.url + path)
    expect(axe_page.locator("form").first).to_be_visible()
    assert serious_violations(axe_page) == []
