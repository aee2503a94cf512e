"""Managing conversations on the page (real browser, real model): rename, search, export, delete."""

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat
from tests.test_browser_accounts import ask
from tests.test_browser_answers import short_policy

pytestmark = pytest.mark.browser


def test_rename_search_export_and_delete_a_conversation(page, daphne_server):
    short_policy(daphne_server)
    open_chat(page, daphne_server)
    ask(page, "Tell me about owls.")
    page.click("#new-chat")
    ask(page, "How is bread baked?")
    links = page.locator("#conversations a")
    expect(links).to_have_count(2)
    expect(page.locator("#conversations .day-label").first).to_have_text("Today")

    # Rename the current one, by keyboard.
    expect(page.locator("#conversation-title")).to_have_text("How is bread baked?")
    page.click("#rename")
    page.fill("#rename-input", "Baking notes")
    page.keyboard.press("Enter")
    expect(page.locator("#conversation-title")).to_have_text("Baking notes")
    expect(page.locator("#conversations a[aria-current=page]")).to_have_text("Baking notes")

    # Search titles and message text.
    page.fill("#search", "owls")
    expect(links).to_have_count(1)
    expect(links.first).to_have_text("Tell me about owls.")
    page.fill("#search", "baking")
    expect(links).to_have_count(1)
    expect(links.first).to_have_text("Baking notes")
    page.fill("#search", "")
    expect(links).to_have_count(2)

    # Export both ways.
    with page.expect_download() as download:
        page.click("#export-md")
    markdown = Path(download.value.path()).read_text(encoding="utf-8")
    assert markdown.startswith("# Baking notes") and "How is bread baked?" in markdown
    with page.expect_download() as download:
        page.click("#export-json")
    data = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    assert data["title"] == "Baking notes" and len(data["messages"]) == 2

    # Delete, after the page's own confirmation, which can be declined.
    page.click("#delete")
    expect(page.locator("#confirm-delete")).to_be_visible()
    expect(page.locator("#confirm-delete-text")).to_contain_text("Baking notes")
    page.click("#confirm-delete-cancel")
    expect(page.locator("#confirm-delete")).to_be_hidden()
    expect(links).to_have_count(2)
    page.click("#delete")
    page.click("#confirm-delete-ok")
    expect(links).to_have_count(1)
    expect(page.locator("#messages .message")).to_have_count(0)
    expect(page.locator("#conversation-tools")).to_be_hidden()
    page.reload()
    expect(page.locator("#conversations a")).to_have_count(1)
