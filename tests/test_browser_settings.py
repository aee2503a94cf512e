"""The settings page in Chromium with the real model and server: a visitor is asked to sign in,
sign-up keeps what was typed after a password mismatch, custom instructions and a default
policy change the next chat (the model's input, read back as the stored answer's identity),
and the API keys page copies a new key and asks before a revoke.
axe-core finds nothing serious on any of these pages."""

import uuid

import pytest
from playwright.sync_api import expect

from tests.a11y import serious_violations
from tests.test_browser import open_chat
from tests.test_browser_answers import short_policy

pytestmark = pytest.mark.browser

PASSWORD = "a-long-pass-phrase-42"
NOTE = "Always answer as a pirate would, and say arr."


def answered(page, server, text: str) -> dict:
    """Send `text` from the chat page; the stored answer's row once it is done."""
    page.fill("#prompt", text)
    expect(page.locator("#send")).to_be_enabled(timeout=30_000)
    page.keyboard.press("Enter")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    message = answer.evaluate("(node) => node.chatAnswer.messageId")
    [row] = server.query("SELECT identity, policy_id FROM chat_message WHERE id = ?", (message,))
    return row


def test_custom_instructions_and_default_policy_change_the_next_chat(axe_page, daphne_server):
    page, server = axe_page, daphne_server
    short_policy(server)
    [short] = server.query("SELECT id FROM chat_outputpolicy WHERE slug = 'short'")
    prompt = f"Say hello to visitor {uuid.uuid4().hex[:6]}."

    page.goto(server.url + "/settings/")
    expect(page.locator("#settings-sign-in")).to_contain_text("Sign in to keep settings")
    assert serious_violations(page) == []

    # Sign up; a mistyped confirmation keeps the name, the address and the first password.
    name = f"set{uuid.uuid4().hex[:8]}"
    page.click("#settings-signup")
    page.fill("#id_username", name)
    page.fill("#id_email", f"{name}@example.org")
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD + "?")
    page.click("button[type=submit]")
    expect(page.locator("#id_password2_error")).to_contain_text("didn’t match")
    expect(page.locator("#id_password2")).to_be_focused()
    expect(page.locator("#id_username")).to_have_value(name)
    expect(page.locator("#id_email")).to_have_value(f"{name}@example.org")
    expect(page.locator("#id_password1")).to_have_value(PASSWORD)
    assert serious_violations(page) == []
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("#signed-in-as")).to_have_text(name)
    expect(page.locator("#account-delete")).to_have_count(0)  # on the settings page now

    open_chat(page, server)
    page.select_option("#policy", "short")
    before = answered(page, server, prompt)

    page.click("#account-settings")
    expect(page.locator("#settings-user")).to_have_text(name)
    assert serious_violations(page) == []
    page.fill("#id_chat-instructions", NOTE)
    page.select_option("#id_chat-default_policy", str(short["id"]))
    page.click("#save-chat")
    expect(page.locator("#settings-saved")).to_contain_text("saved")
    expect(page.locator("#id_chat-instructions")).to_have_value(NOTE)
    assert serious_violations(page) == []

    # A new chat starts on the chosen policy, and the model reads the note: the same prompt
    # under the same policy is another answer (another identity: the model's input differs).
    open_chat(page, server)
    page.click("#new-chat")
    expect(page.locator("#policy")).to_have_value("short")
    after = answered(page, server, prompt)
    assert after["policy_id"] == before["policy_id"] == short["id"]
    assert after["identity"] and before["identity"] and after["identity"] != before["identity"]


def test_the_api_keys_page_copies_the_new_key_and_asks_before_revoking(axe_page, daphne_server):
    page, server = axe_page, daphne_server
    name = f"key{uuid.uuid4().hex[:8]}"
    page.goto(server.url + "/accounts/signup/")
    page.fill("#id_username", name)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("#signed-in-as")).to_have_text(name)
    page.click("#account-settings")
    page.click("#settings-api-keys")
    page.fill("#key-name", "laptop")
    page.click("button[name=create]")
    key = page.locator("#new-key").inner_text()
    page.click("#copy-key")
    expect(page.locator("#copy-status")).to_have_text("Copied.")
    assert page.evaluate("() => navigator.clipboard.readText()") == key
    assert serious_violations(page) == []

    page.goto(server.url + "/account/api-keys/")
    page.get_by_role("link", name="Revoke laptop").click()
    expect(page.locator("#confirm-revoke")).to_contain_text("Revoke the key laptop")
    assert serious_violations(page) == []
    page.click("#revoke-cancel")
    expect(page.locator("#confirm-revoke")).to_have_count(0)
    page.get_by_role("link", name="Revoke laptop").click()
    page.click("#revoke-confirm")
    expect(page.locator("#revoked-keys summary")).to_have_text("Revoked (1)")
    expect(page.locator("#active-keys")).to_have_count(0)
    assert serious_violations(page) == []
