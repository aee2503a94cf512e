"""Sign-in with an OpenID Connect provider in a real browser: Chromium, a live daphne with the
real model and CHAT_OIDC, and django-oauth-toolkit on loopback as the provider
(harness/oidc_provider/), its RS256 key generated here."""

import pytest
from playwright.sync_api import expect

from harness.liveserver import LiveServer
from harness.oidc_provider import OidcProvider
from tests.conftest import LIVE_CACHE_URL
from tests.test_browser import open_chat
from tests.test_browser_accounts import ask
from tests.test_browser_answers import short_policy

pytestmark = pytest.mark.browser

SECRET = "browser-client-secret"
PASSWORD = "provider-pass-phrase-9"


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    server = OidcProvider(tmp_path_factory.mktemp("oidc")).start()
    server.user("grace", PASSWORD, email="grace@example.com", groups=["chat-staff"])
    server.user("hal", PASSWORD, email="hal@example.com", groups=["other"])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oidc_server(tmp_path_factory, provider):
    """A daphne signing in through `provider` (staff from chat-staff), local accounts kept."""
    server = LiveServer(
        tmp_path_factory.mktemp("live-oidc"),
        CHAT_CACHE_REDIS_URL=LIVE_CACHE_URL,
        CHAT_OIDC=provider.spec("chat", SECRET, staff_groups="chat-staff"),
    )
    provider.client(
        "chat",
        SECRET,
        redirect_uris=[f"{server.url}/accounts/oidc/callback/"],
        post_logout_uris=[f"{server.url}/"],
    )
    server.start()
    short_policy(server)
    yield server
    server.stop()


def sign_in_at_provider(page, server, username: str) -> None:
    """The page's Sign in, the provider's button, the provider's form, back in the chat."""
    open_chat(page, server)
    page.click("#sign-in")
    expect(page.locator("#sign-in-oidc")).to_have_text("Sign in with Loopback ID")
    page.click("#sign-in-oidc")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("#provider-sign-in")
    expect(page.locator("#signed-in-as")).to_have_text(username, timeout=30_000)


def test_signing_in_at_the_provider_lands_in_the_chat_as_its_user(page, oidc_server):
    """The provider's user chats over the socket as themself (the conversation is theirs, in
    their list after a reload); signing out ends the provider's session too, so the next
    sign-in asks for the password again."""
    sign_in_at_provider(page, oidc_server, "grace")
    ask(page, "Say hello to Grace.")
    expect(page.locator("#conversations a")).to_have_count(1)
    owner = oidc_server.manage(
        "shell", "-c", "from chat.models import Conversation as C; print(C.objects.get().user)"
    )
    assert owner.splitlines()[-1] == "grace"  # after the shell's own banner
    page.reload()
    expect(page.locator("#conversations a")).to_have_count(1)
    page.click("#sign-out")
    expect(page.locator("#sign-in")).to_be_visible(timeout=30_000)
    assert page.url.startswith(oidc_server.url)  # back from the provider's sign-out
    expect(page.locator("#conversations a")).to_have_count(0)
    page.click("#sign-in")
    page.click("#sign-in-oidc")
    expect(page.locator("#provider-login")).to_be_visible()  # the provider asks again


def test_the_staff_group_opens_the_admin_and_no_other_group_does(browser, oidc_server):
    """grace (chat-staff) reaches the admin's index; hal (another group) is told he is not
    authorized."""
    for username, allowed in (("grace", True), ("hal", False)):
        context = browser.new_context()
        page = context.new_page()
        sign_in_at_provider(page, oidc_server, username)
        page.goto(oidc_server.url + "/admin/")
        if allowed:
            expect(page.locator("#site-name")).to_be_visible()
            expect(page.locator("body")).not_to_contain_text("not authorized")
        else:
            expect(page.locator("body")).to_contain_text(
                f"You are authenticated as {username}, but are not authorized"
            )
        context.close()
