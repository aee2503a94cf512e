"""Branches in a real browser with the real model: edit an earlier prompt and go on there, switch
between the versions with "‹ 1/2 ›", and land on the chosen branch after a reload."""

import pytest
from playwright.sync_api import expect

from tests.a11y import axe_context, serious_violations
from tests.test_browser import open_chat

pytestmark = pytest.mark.browser

FIRST = "Count from 1 to 10, separated by commas."
EDITED = "Count from 5 to 9."


def ask(page, text: str) -> None:
    page.fill("#prompt", text)
    page.keyboard.press("Enter")
    expect(page.locator(".message.assistant").last).to_have_attribute(
        "data-state", "done", timeout=60_000
    )


def prompts(page):
    return page.locator(".message.user .text")


def test_edit_an_earlier_prompt_go_on_there_switch_back_and_reload(browser, daphne_server):
    daphne_server.policy("short", name="Short", mode="stream", max_new_tokens=8)
    context = axe_context(browser)
    page = context.new_page()
    try:
        open_chat(page, daphne_server)
        page.select_option("#policy", "short")
        ask(page, FIRST)
        ask(page, "Name three colors.")
        expect(prompts(page)).to_have_text([FIRST, "Name three colors."])

        # Edit the first prompt: the thread forks there, the later turn stays on the old branch.
        first = page.locator(".message.user").first
        first.locator("button.edit-prompt").click()
        expect(page.locator("#prompt")).to_have_value(FIRST)
        page.fill("#prompt", EDITED)
        page.keyboard.press("Enter")
        expect(prompts(page)).to_have_text([EDITED])
        expect(page.locator(".message.assistant").last).to_have_attribute(
            "data-state", "done", timeout=60_000
        )
        position = page.locator(".message.user").first.locator(".version-position")
        expect(position).to_have_text("Version 2/2")
        ask(page, "Name three animals.")
        expect(prompts(page)).to_have_text([EDITED, "Name three animals."])
        assert serious_violations(page) == []

        # Back to the first version: its own later turn shows again, and the switch is kept.
        previous = page.locator(".message.user").first.locator("button.version-prev")
        expect(previous).to_have_accessible_name("Previous version")
        previous.click()
        expect(prompts(page)).to_have_text([FIRST, "Name three colors."])
        expect(position).to_have_text("Version 1/2")
        expect(page.locator("#announcer")).to_have_text("Version 1 of 2.")
        expect(page.locator(".message.user").first.locator("button.version-prev")).to_be_disabled()
        expect(page.locator(".message.user").first.locator("button.version-next")).to_be_focused()
        assert serious_violations(page) == []
        page.reload()
        expect(prompts(page)).to_have_text([FIRST, "Name three colors."], timeout=10_000)

        # Forward again, by keyboard: the edited branch with the turn that went on from it.
        page.locator(".message.user").first.locator("button.version-next").focus()
        page.keyboard.press("Enter")
        expect(prompts(page)).to_have_text([EDITED, "Name three animals."])
        page.reload()
        expect(prompts(page)).to_have_text([EDITED, "Name three animals."], timeout=10_000)
        expect(position).to_have_text("Version 2/2")
        ask(page, "And three birds?")  # goes on where the page is: the edited branch
        page.reload()
        expect(prompts(page)).to_have_text(
            [EDITED, "Name three animals.", "And three birds?"], timeout=10_000
        )
    finally:
        context.close()
