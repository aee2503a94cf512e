"""daphne restarted under a page: it shows it is reconnecting, comes back, and nothing is lost."""

import re

import pytest
from playwright.sync_api import expect

from harness.liveserver import LiveServer
from tests.conftest import LIVE_CACHE_URL
from tests.test_browser import open_chat

pytestmark = pytest.mark.browser

LONG = "Write a very long story about a dragon who learns to bake bread."


@pytest.fixture
def own_server(tmp_path):
    """A daphne of this test's own: restarting the shared one would disturb other tests.
    A running answer gets 1 s of drain on SIGTERM (project/shutdown.py), then it is cancelled."""
    server = LiveServer(
        tmp_path, CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL, CHAT_TIMEOUTS="drain=1"
    ).start()
    yield server
    server.stop()


def test_a_restarted_server_keeps_history_and_the_page_reconnects_by_itself(page, own_server):
    """Chat, stop daphne (SIGTERM) mid-answer, start it again on the same port and database: the
    answer ends cancelled after the drain, the page says the server restarted and it is
    reconnecting and disables Send, then is connected again; a new prompt in the same conversation is
    answered; after a reload the history holds every turn, and the answer cut by the restart is marked
    ended (never "still being written")."""
    server = own_server
    open_chat(page, server)
    page.fill("#prompt", "Count from 1 to 10, separated by commas.")
    page.click("#send")
    first = page.locator(".message.assistant").last
    expect(first).to_have_attribute("data-state", "done", timeout=60_000)
    first_text = first.locator(".text").inner_text()
    conversation_url = page.url
    assert "?c=" in conversation_url

    page.fill("#prompt", LONG)
    page.click("#send")
    cut = page.locator(".message.assistant").last
    expect(cut.locator(".text")).not_to_be_empty(timeout=30_000)
    server.stop()
    expect(page.locator("#connection")).to_have_attribute("data-state", "closed")
    expect(page.locator("#connection-label")).to_have_text("the server restarted, reconnecting…")
    expect(cut).to_have_attribute("data-state", "cancelled")
    expect(cut.locator(".badge")).to_have_text("Stopped: the server restarted")
    page.fill("#prompt", "Are you there?")
    expect(page.locator("#send")).to_be_disabled()

    server.start()
    expect(page.locator("#connection")).to_have_attribute("data-state", "open", timeout=30_000)
    expect(page.locator("#connection-label")).to_have_text("connected")
    expect(page.locator("#send")).to_be_enabled(timeout=30_000)
    page.fill("#prompt", "Count from 1 to 5, separated by commas.")
    page.click("#send")
    after = page.locator(".message.assistant").last
    expect(after).to_have_attribute("data-state", "done", timeout=60_000)
    expect(after.locator(".text")).to_have_text(
        re.compile(r"^1, 2, 3")
    )  # the context may make it go on to 10
    after_text = after.locator(".text").inner_text()
    assert page.url == conversation_url  # the same conversation went on

    page.reload()
    answers = page.locator(".message.assistant")
    expect(answers).to_have_count(3, timeout=10_000)
    expect(page.locator(".message.user")).to_have_count(3)
    expect(answers.nth(0).locator(".text")).to_have_text(first_text)
    expect(answers.nth(1)).to_have_attribute("data-state", re.compile(r"^(cancelled|error)$"))
    expect(answers.nth(1).locator(".status")).not_to_contain_text("Still being written")
    expect(answers.nth(2).locator(".text")).to_have_text(after_text)
