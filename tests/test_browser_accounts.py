"""Accounts in a real browser with the real model: sign up, chat, sign out, sign in elsewhere."""

import uuid

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat
from tests.test_browser_answers import short_policy

pytestmark = pytest.mark.browser

PASSWORD = "a-long-pass-phrase-42"


def ask(page, text: str) -> None:
    page.select_option("#policy", "short")
    page.fill("#prompt", text)
    # After a sign-up or a new chat the socket may still be reconnecting: Enter is ignored (the
    # text stays in the box) until Send is enabled, as a user would see.
    expect(page.locator("#send")).to_be_enabled(timeout=30_000)
    page.keyboard.press("Enter")
    expect(page.locator(".message.assistant").last).to_have_attribute(
        "data-state", "done", timeout=60_000
    )


def test_sign_up_chat_sign_out_and_sign_in_from_a_fresh_browser(browser, daphne_server):
    """The visitor's chat moves into the new account; another browser signing in finds every chat,
    including the one it had started anonymously before signing in."""
    short_policy(daphne_server)
    name = f"user{uuid.uuid4().hex[:8]}"
    first = browser.new_context()
    page = first.new_page()
    open_chat(page, daphne_server)
    ask(page, "Say hello as a visitor.")
    page.click("#sign-up")
    page.fill("#id_username", name)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("#signed-in-as")).to_have_text(name)
    expect(page.locator("#conversations a")).to_have_count(1)  # adopted on sign-up
    page.click("#new-chat")
    ask(page, "Say hello as a member.")
    expect(page.locator("#conversations a")).to_have_count(2)
    page.click("#sign-out")
    expect(page.locator("#sign-in")).to_be_visible()
    expect(page.locator("#conversations a")).to_have_count(0)
    first.close()

    second = browser.new_context()
    page = second.new_page()
    open_chat(page, daphne_server)
    ask(page, "Say hello before signing in.")
    page.click("#sign-in")
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("#signed-in-as")).to_have_text(name)
    links = page.locator("#conversations a")
    expect(links).to_have_count(3)  # two from the first browser, one adopted on sign-in
    page.locator("#conversations a", has_text="Say hello as a visitor.").click()
    expect(page.locator(".message.user .text").first).to_have_text("Say hello as a visitor.")
    second.close()
