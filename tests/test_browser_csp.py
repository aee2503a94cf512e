"""The strict Content-Security-Policy breaks nothing: the chat page and the admin in real Chromium."""

import pytest
from playwright.sync_api import expect

from tests.test_browser import open_chat

pytestmark = pytest.mark.browser

RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__violations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'}`);
});
"""

ADMIN_PAGES = [
    "/admin/",
    "/admin/chat/outputpolicy/",
    "/admin/chat/outputpolicy/add/",
    "/admin/chat/message/",
    "/admin/chat/cachedanswer/",
    "/admin/latency/",
    "/admin/behaviour/",
    "/admin/chat/apikey/",
    "/admin/auditlog/logentry/",
    # The signed-in person's own pages, with the same session.
    "/account/api-keys/",
    "/accounts/password_change/",
    "/settings/",
]


def watch(page) -> list[str]:
    """Console lines about the CSP (Chromium logs each refusal as an error) and script errors."""
    problems: list[str] = []
    page.on(
        "console",
        lambda msg: (
            problems.append(msg.text)
            if "Content Security Policy" in msg.text or "Refused to" in msg.text
            else None
        ),
    )
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.add_init_script(RECORD_VIOLATIONS)
    return problems


def violations(page) -> list[str]:
    return page.evaluate("window.__violations")


def test_the_chat_page_runs_under_the_policy(page, daphne_server):
    """The page loads its script and styles, opens the socket (connect-src) and shows an answer."""
    problems = watch(page)
    response = page.goto(daphne_server.url + "/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    open_chat(page, daphne_server)
    page.fill("#prompt", "Say hi.")
    page.click("#send")
    answer = page.locator(".message.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)
    assert violations(page) == [] and problems == []


def test_the_admin_pages_run_under_the_policy(page, daphne_server):
    """Sign-in, the index, lists, an add form with its widgets and the latency charts: nothing refused."""
    daphne_server.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User; "
        "User.objects.filter(username='csp').exists() or "
        "User.objects.create_superuser('csp', 'csp@example.com', 'csp-secret-4711')",
    )
    problems = watch(page)
    page.goto(daphne_server.url + "/admin/login/")
    page.fill("#id_username", "csp")
    page.fill("#id_password", "csp-secret-4711")
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text("csp")
    seen = {}
    for path in ADMIN_PAGES:
        response = page.goto(daphne_server.url + path)
        assert response.status == 200, path
        assert "default-src 'self'" in response.headers["content-security-policy"]
        seen[path] = violations(page)
    page.goto(daphne_server.url + "/admin/latency/")
    expect(page.locator(".latency-controls")).to_have_css(
        "display", "flex"
    )  # its stylesheet loaded
    page.goto(daphne_server.url + "/account/api-keys/")
    expect(page.locator(".keys-page")).to_have_css("max-width", "800px")  # chat.css styles it
    assert all(v == [] for v in seen.values()), seen
    assert problems == []
