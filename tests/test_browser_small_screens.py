"""Phones and keyboards: the sidebar is a drawer on a phone; the page works from the keyboard alone."""

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat
from tests.test_browser_answers import short_policy

pytestmark = pytest.mark.browser


def test_on_a_phone_the_sidebar_is_a_drawer_that_opens_and_closes(browser, daphne_server):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    try:
        open_chat(page, daphne_server)
        sidebar = page.locator("#sidebar")
        toggle = page.locator("#sidebar-toggle")
        expect(toggle).to_be_visible()
        expect(sidebar).to_be_hidden()  # visibility: hidden, so not tabbable either
        toggle.click()
        expect(sidebar).to_be_visible()
        expect(toggle).to_have_attribute("aria-expanded", "true")
        expect(page.locator("#search")).to_be_focused()
        page.keyboard.press("Escape")
        expect(sidebar).to_be_hidden()
        expect(toggle).to_be_focused()
        expect(page.locator("#prompt")).to_be_visible()
        toggle.click()
        expect(sidebar).to_be_visible()
        page.mouse.click(370, 400)  # beside the drawer
        expect(sidebar).to_be_hidden()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, width  # nothing forces sideways scrolling
    finally:
        context.close()


def test_a_keyboard_alone_asks_stops_copies_and_reaches_every_control(browser, daphne_server):
    """Tab reaches the composer's and the answer's controls; Enter sends; the status announces."""
    short_policy(daphne_server)
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daphne_server.url)
    page = context.new_page()
    try:
        open_chat(page, daphne_server)
        page.select_option("#policy", "short")
        page.focus("#prompt")
        page.keyboard.type("Say hello.")
        page.keyboard.press("Enter")
        answer = page.locator(".message.assistant").last
        expect(answer).to_have_attribute("aria-busy", "true")
        expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
        expect(answer).to_have_attribute("aria-busy", "false")
        expect(page.locator("#announcer")).to_have_text("Answer finished.")
        expect(page.locator("#messages")).to_have_attribute("aria-live", "polite")
        # Walk the tab order from the top and collect what it reaches.
        page.focus("body")
        reached = set()
        for _ in range(40):
            page.keyboard.press("Tab")
            reached.add(
                page.evaluate(
                    "() => { const e = document.activeElement;"
                    " return e.id || e.className || e.tagName; }"
                )
            )
        for control in (
            "new-chat",
            "search",
            "rename",
            "delete",
            "prompt",
            "policy",
            "action copy-answer",
            "action regenerate",
            "action edit-prompt",
        ):
            assert control in reached, (control, reached)
        answer.locator("button.copy-answer").focus()
        page.keyboard.press("Enter")
        assert page.evaluate("navigator.clipboard.readText()") == answer.evaluate(
            "(node) => node.chatAnswer.text"
        )
    finally:
        context.close()
