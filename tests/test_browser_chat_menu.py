"""The sidebar's per-chat menu in Chromium: rename another chat in place, pin, archive and
unarchive, delete through the page's dialog, each surviving a reload; axe-core throughout."""

import pytest
from playwright.sync_api import expect

from tests.a11y import serious_violations
from tests.test_browser import open_chat
from tests.test_browser_accounts import ask
from tests.test_browser_answers import short_policy

pytestmark = pytest.mark.browser


def chat_item(page, title):
    return page.locator(
        "#sidebar li.chat-item", has=page.get_by_role("link", name=title, exact=True)
    )


def open_menu(page, title):
    chat_item(page, title).hover()
    chat_item(page, title).get_by_role("button", name=f"Options for “{title}”").click()
    expect(page.get_by_role("menu")).to_be_visible()


def titles(page, selector="#conversations"):
    return page.locator(f"{selector} li.chat-item a").all_inner_texts()


def test_rename_pin_archive_and_delete_chats_from_the_sidebar_menu(axe_page, daphne_server):
    page = axe_page
    short_policy(daphne_server)
    open_chat(page, daphne_server)
    ask(page, "Tell me about owls.")
    page.click("#new-chat")
    ask(page, "Tell me about cats.")
    page.click("#new-chat")
    ask(page, "Tell me about bread.")
    expect(page.locator("#conversations li.chat-item")).to_have_count(3)
    assert titles(page) == ["Tell me about bread.", "Tell me about cats.", "Tell me about owls."]

    # Rename a chat that is not the open one, by keyboard: focus its button, open with Enter.
    chat_item(page, "Tell me about owls.").locator(".chat-menu-button").focus()
    page.keyboard.press("Enter")
    menu = page.get_by_role("menu")
    expect(menu).to_be_visible()
    expect(menu.get_by_role("menuitem").first).to_be_focused()
    assert serious_violations(page) == []
    page.keyboard.press("Escape")
    expect(menu).to_be_hidden()
    expect(chat_item(page, "Tell me about owls.").locator(".chat-menu-button")).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(menu.get_by_role("menuitem", name="Rename")).to_be_focused()
    page.keyboard.press("Enter")
    field = page.get_by_label("New title (Enter saves, Esc cancels)")
    expect(field).to_be_focused()
    field.fill("Night birds")
    page.keyboard.press("Enter")
    expect(chat_item(page, "Night birds")).to_have_count(1)
    expect(page.locator("#conversation-title")).to_have_text("Tell me about bread.")  # still open

    # Pin the oldest: it heads the list, under "Pinned".
    open_menu(page, "Night birds")
    menu.get_by_role("menuitem", name="Pin").click()
    expect(page.locator("#conversations li").first).to_have_text("Pinned")
    expect(page.locator("#conversations li.chat-item a").first).to_have_text("Night birds")

    # Archive one: it leaves the list, and the Archived section lists it.
    open_menu(page, "Tell me about cats.")
    menu.get_by_role("menuitem", name="Archive").click()
    expect(chat_item(page, "Tell me about cats.")).to_have_count(0)
    page.click("#archived-toggle")
    expect(page.locator("#archived li.chat-item a")).to_have_text(["Tell me about cats."])
    assert serious_violations(page) == []

    page.reload()
    expect(page.locator("#conversations li.chat-item a")).to_have_text(
        ["Night birds", "Tell me about bread."]
    )
    expect(page.locator("#conversations li").first).to_have_text("Pinned")
    page.click("#archived-toggle")
    expect(page.locator("#archived li.chat-item a")).to_have_text(["Tell me about cats."])

    # Unarchive it from the Archived section.
    open_menu(page, "Tell me about cats.")
    expect(menu.get_by_role("menuitem", name="Unarchive")).to_be_visible()
    menu.get_by_role("menuitem", name="Unarchive").click()
    expect(page.locator("#archived li.chat-item")).to_have_count(0)
    expect(page.locator("#conversations li.chat-item a")).to_have_text(
        ["Night birds", "Tell me about bread.", "Tell me about cats."]
    )

    # Delete through the dialog: Cancel keeps it, Delete removes it.
    page.on("dialog", lambda dialog: pytest.fail(f"a browser dialog: {dialog.message}"))
    open_menu(page, "Night birds")
    menu.get_by_role("menuitem", name="Delete").click()
    dialog = page.get_by_role("dialog", name="Delete this chat?")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("“Night birds” and all its messages will be deleted")
    assert serious_violations(page) == []
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(chat_item(page, "Night birds")).to_have_count(1)
    open_menu(page, "Night birds")
    menu.get_by_role("menuitem", name="Delete").click()
    dialog.get_by_role("button", name="Delete").click()
    expect(chat_item(page, "Night birds")).to_have_count(0)
    expect(page.locator("#search")).to_be_focused()  # not lost to the page's top
    expect(page.locator("#conversation-title")).to_have_text("Tell me about bread.")  # still open

    page.reload()
    expect(page.locator("#conversations li.chat-item a")).to_have_text(
        ["Tell me about bread.", "Tell me about cats."]
    )
    expect(page.locator("#conversations .day-label")).to_have_text(["Today"])
