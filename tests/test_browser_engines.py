"""A policy answered by another engine, in a real browser: the picker names the engine, and the
answer names the engine and its model (a real `transformers serve`, the `peer` fixture)."""

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat

pytestmark = pytest.mark.browser

ROWS = """
from chat.models import Engine, OutputPolicy
engine, _ = Engine.objects.get_or_create(
    slug="peer-browser",
    defaults=dict(name="Peer engine", kind="remote", api_root={url!r}, served_model={model!r}),
)
OutputPolicy.objects.get_or_create(
    slug="far", defaults=dict(name="Far", engine=engine, mode="stream", max_new_tokens=8)
)
"""
GONE = """
from chat.models import Engine, OutputPolicy
OutputPolicy.objects.filter(slug="far").delete()
Engine.objects.filter(slug="peer-browser").delete()
"""


def test_a_policy_on_the_other_engine_answers_with_its_model_named(page, daphne_server, peer):
    daphne_server.manage("shell", "-c", ROWS.format(url=peer.base_url, model=peer.model))
    try:
        open_chat(page, daphne_server)
        expect(page.locator('#policy option[value="far"]')).to_contain_text("Peer engine")
        page.select_option("#policy", "far")
        page.fill("#prompt", "Count from 1 to 10, separated by commas.")
        page.keyboard.press("Enter")
        answer = page.locator(".message.assistant").last
        expect(answer).to_have_attribute("data-state", "done", timeout=120_000)
        metrics = answer.locator(".metrics")
        expect(metrics).to_contain_text(f"Peer engine ({peer.model})")
    finally:
        daphne_server.manage("shell", "-c", GONE)
