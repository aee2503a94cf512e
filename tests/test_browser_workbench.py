"""The policy workbench in a real browser on a live daphne: "Try this draft" runs the unsaved
form and shows the answer beside the model's text, without saving anything."""

from __future__ import annotations

import os
import uuid

import pytest
from playwright.sync_api import expect

from tests.test_browser_screenshots import target

PASSWORD = "workbench-pass-phrase-42"

SEED = """
from django.contrib.auth.models import User
from chat.models import OutputPolicy, RegressionCase
User.objects.create_superuser({name!r}, password={password!r})
policy = OutputPolicy.objects.create(name={slug!r}, slug={slug!r}, max_new_tokens=12)
RegressionCase.objects.create(policy=policy, prompt="Say hello.", expected="delivered")
"""

VERSION = """
from chat.models import OutputPolicy
print("version", OutputPolicy.objects.get(slug={slug!r}).version)
"""


@pytest.mark.browser
def test_try_this_draft_shows_the_answer_of_the_unsaved_form(page, daphne_server):
    tag = uuid.uuid4().hex[:8]
    name, slug = f"wb{tag}", f"wb-{tag}"
    daphne_server.manage("shell", "-c", SEED.format(name=name, password=PASSWORD, slug=slug))
    page.goto(daphne_server.url + "/admin/login/?next=/admin/chat/outputpolicy/")
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.get_by_role("link", name=slug, exact=True).click()

    # A draft that would not save: the form's error, and no answer.
    page.fill("#id_json_schema", '{"type": "objekt"}')
    page.fill("#trial-prompt", "What is the capital of France?")
    page.click("#trial-run")
    expect(page.locator("#trial-form-errors")).to_contain_text("not a valid JSON Schema")
    expect(page.locator("#trial-status")).to_contain_text("refused (400)")
    expect(page.locator("#trial-verdict")).to_have_count(0)

    # Fixed, plus an unsaved hook that vetoes any visible character: the user would get nothing.
    # The hook is added in the hooks editor (its inputs come from the hook's signature), in the
    # form's folded "Checks" fieldset.
    page.fill("#id_json_schema", "")
    page.get_by_text("Checks before anyone sees the answer").click()
    page.locator('details.hook-add[data-hook="blocklist"] summary').click()
    page.check("#moderation_hooks-add-blocklist")
    page.fill("#moderation_hooks-new-blocklist-p-patterns", "\\S")
    page.click("#trial-run")
    expect(page.locator("#trial-status")).to_have_text("done", timeout=120_000)
    expect(page.locator("#trial-result")).to_have_attribute("data-finish", "moderated")
    expect(page.locator("#trial-reason")).to_contain_text("blocked pattern")
    expect(page.locator("#trial-raw")).not_to_be_empty()
    expect(page.locator("#trial-shown")).to_be_empty()
    expect(page.locator("#trial-metrics")).to_contain_text("ttft_ms")
    if os.environ.get("DOCS_SCREENSHOTS") == "1":
        page.set_viewport_size({"width": 1280, "height": 900})
        page.locator("#trial-panel").screenshot(path=str(target() / "screenshot-workbench.png"))
        page.locator("#moderation_hooks-editor").screenshot(
            path=str(target() / "screenshot-hooks-editor.png")
        )

    # Without the hook the same prompt is answered; still nothing was saved.
    page.uncheck("#moderation_hooks-add-blocklist")
    page.click("#trial-run")
    expect(page.locator("#trial-result")).not_to_have_attribute(
        "data-finish", "moderated", timeout=120_000
    )
    expect(page.locator("#trial-shown")).not_to_be_empty()

    # The regression set (one saved case) through the same draft, beside no run before.
    expect(page.locator("#regressions-last")).to_contain_text("Not run yet.")
    page.click("#regressions-run")
    expect(page.locator("#regressions-status")).to_have_text("done", timeout=120_000)
    expect(page.locator("#regressions-summary")).to_contain_text("1 of 1 passed (100%)")
    expect(page.locator("#regressions-summary")).to_contain_text("the first run of this policy")
    out = daphne_server.manage("shell", "-c", VERSION.format(slug=slug))
    assert "version 1" in out
