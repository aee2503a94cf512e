"""Screenshots of the page for README.md and docs/using.md, desktop (1280x800) and phone (390x844), real model.

They go to var/screenshots/ (SCREENSHOT_DIR); `DOCS_SCREENSHOTS=1` writes them to docs/ instead.
"""

import os
import re
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.test_browser import SCREENSHOT_DIR, open_chat

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parent.parent / "docs"
PASSWORD = "a-long-pass-phrase-42"


def target() -> Path:
    folder = DOCS if os.environ.get("DOCS_SCREENSHOTS") == "1" else SCREENSHOT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sign_up(page, server) -> None:
    page.goto(server.url + "/accounts/signup/")
    page.fill("#id_username", f"ada{uuid.uuid4().hex[:4]}")
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")


def ask(page, text: str) -> None:
    page.fill("#prompt", text)
    page.keyboard.press("Enter")
    ended = re.compile("done|cancelled|invalid|retracted|error")
    last = page.locator(".message.assistant").last
    expect(last).to_have_attribute("data-state", ended, timeout=120_000)


def test_screenshots_desktop_and_phone(browser, daphne_server):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    page = context.new_page()
    try:
        sign_up(page, daphne_server)
        open_chat(page, daphne_server)
        ask(page, "What is the capital of France?")
        page.click("#new-chat")
        ask(page, "Write a Python function that adds two numbers. Use a code block.")
        page.wait_for_timeout(300)
        page.screenshot(path=str(target() / "screenshot.png"))
        url = page.url
        page.click("#new-chat")
        page.select_option("#policy", "json")
        ask(page, "What is the capital of France?")
        page.wait_for_timeout(300)
        page.screenshot(path=str(target() / "screenshot-json.png"))
        phone = browser.new_context(
            viewport={"width": 390, "height": 844},
            is_mobile=True,
            color_scheme="light",
            storage_state=context.storage_state(),
        )
        mobile = phone.new_page()
        mobile.goto(url)
        expect(mobile.locator(".message.assistant").last).to_be_visible(timeout=10_000)
        mobile.wait_for_timeout(300)
        mobile.screenshot(path=str(target() / "screenshot-phone.png"))
        mobile.click("#sidebar-toggle")
        mobile.wait_for_timeout(400)
        mobile.screenshot(path=str(target() / "screenshot-phone-sidebar.png"))
        phone.close()
    finally:
        context.close()


def test_screenshot_branches(browser, daphne_server):
    """docs/img/branches.png: a prompt edited into a second version whose answer was regenerated,
    both showing ‹ 2/2 ›, and the chat going on from there."""
    daphne_server.policy("brief", name="Brief", mode="stream", max_new_tokens=24)
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    page = context.new_page()
    try:
        open_chat(page, daphne_server)
        page.select_option("#policy", "brief")
        ask(page, "Suggest a name for a cat.")
        page.locator(".message.user").last.locator("button.edit-prompt").click()
        page.fill("#prompt", "Suggest a name for a black cat.")
        page.keyboard.press("Enter")
        last = page.locator(".message.assistant").last
        expect(page.locator(".message.user .version-position")).to_have_text("Version 2/2")
        expect(last).to_have_attribute("data-state", "done", timeout=120_000)
        last.locator("button.regenerate").click()
        expect(last.locator(".version-position")).to_have_text("Version 2/2", timeout=120_000)
        ask(page, "Why that name?")
        page.wait_for_timeout(300)
        folder = target() / "img"
        folder.mkdir(exist_ok=True)
        page.screenshot(path=str(folder / "branches.png"))
    finally:
        context.close()


# The shipped "JSON answer" policy, held to four tokens and no retry: its answer cannot be whole
# JSON, so it fails and explains itself whatever the model writes.
HELD_JSON = """
from chat.models import OutputPolicy as P
if not P.objects.filter(slug="json-held").exists():
    p = P.objects.get(slug="json")
    p.pk, p.slug, p.is_default, p.max_new_tokens, p.max_retries = None, "json-held", False, 4, 0
    p.save()
"""


def test_screenshot_a_held_answer_that_failed(browser, daphne_server):
    daphne_server.manage("shell", "-c", HELD_JSON)
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    page = context.new_page()
    try:
        sign_up(page, daphne_server)
        open_chat(page, daphne_server)
        page.select_option("#policy", "json-held")
        ask(page, "What is the capital of France?")
        answer = page.locator(".message.assistant").last
        expect(answer).to_have_attribute("data-state", "invalid")
        expect(answer.locator(".explanation-expected")).to_be_visible()
        page.wait_for_timeout(300)
        page.screenshot(path=str(target() / "screenshot-failed-json.png"))
    finally:
        context.close()


def test_screenshot_the_review_page_with_feedback(browser, daphne_server):
    from tests.test_browser_review import MADE_AND_RATED, sign_in
    from tests.test_browser_review import PASSWORD as ADMIN_PASSWORD

    tag = uuid.uuid4().hex[:10]
    name = f"admin{tag}"
    daphne_server.manage(
        "shell", "-c", MADE_AND_RATED.format(name=name, password=ADMIN_PASSWORD, tag=tag)
    )
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    page = context.new_page()
    try:
        sign_in(page, daphne_server, name, f"/admin/chat/cachedanswer/?q={tag}")
        page.locator("#result_list a.review-read").first.click()
        expect(page.locator(".field-feedback_panel")).to_contain_text("they hunt at night")
        page.wait_for_timeout(300)
        page.screenshot(path=str(target() / "screenshot-review-feedback.png"), full_page=True)
    finally:
        context.close()


GPU_ENGINE = """
from django.contrib.auth.models import User
from chat.models import Engine, OutputPolicy
User.objects.create_superuser({name!r}, password={password!r})
gpu = Engine.objects.create(
    name="GPU server", slug="gpu-{tag}", kind="remote", api_root="http://127.0.0.1:9/v1",
    served_model="Qwen2.5-7B-Instruct", max_concurrency=16, context_length=32768, cost_weight=8,
)
p = OutputPolicy.objects.get(slug="json")
p.pk, p.slug, p.name, p.is_default, p.engine = None, "json-gpu-{tag}", "JSON on the GPU", False, gpu
p.save()
"""
GPU_ENGINE_GONE = """
from chat.models import Engine, OutputPolicy
OutputPolicy.objects.filter(slug="json-gpu-{tag}").delete()
Engine.objects.filter(slug="gpu-{tag}").delete()
"""


def test_screenshot_the_engines_admin_and_the_picker(browser, daphne_server):
    """docs/screenshot-engines.png: the engines admin beside the default engine;
    docs/screenshot-picker.png: the page's picker naming a policy's engine."""
    from tests.test_browser_review import PASSWORD as ADMIN_PASSWORD
    from tests.test_browser_review import sign_in

    tag = uuid.uuid4().hex[:8]
    name = f"admin{tag}"
    daphne_server.manage(
        "shell", "-c", GPU_ENGINE.format(name=name, password=ADMIN_PASSWORD, tag=tag)
    )
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    page = context.new_page()
    try:
        sign_in(page, daphne_server, name, "/admin/chat/engine/")
        expect(page.locator("#result_list")).to_contain_text("GPU server")
        page.screenshot(path=str(target() / "screenshot-engines.png"))
        open_chat(page, daphne_server)
        page.select_option("#policy", f"json-gpu-{tag}")
        expect(page.locator("#policy option:checked")).to_contain_text("(GPU server)")
        page.wait_for_timeout(300)
        page.screenshot(path=str(target() / "screenshot-picker.png"))
    finally:
        context.close()
        daphne_server.manage("shell", "-c", GPU_ENGINE_GONE.format(tag=tag))
