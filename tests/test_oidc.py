"""Sign-in with an OpenID Connect provider, against a real one: django-oauth-toolkit in its own
process on loopback (harness/oidc_provider/), its RS256 key generated here. The chat runs in
process (Django's test client), so each test sets CHAT_OIDC through settings; the protocol
(authorization request, the provider's sign-in form, code exchange with PKCE, ID token and
userinfo, RP-initiated sign-out) is the real thing, never mocked."""

import itertools
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client

from chat.infra import oidc_provider
from chat.infra.ratelimit import signin_account_limiter, signin_address_limiter
from chat.models import Conversation, OidcIdentity
from harness.liveserver import free_port
from harness.oidc_provider import OidcProvider, provider_sign_in
from project import settings as product
from tests.conftest import TEST_CACHE_URL

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

SECRET = "loopback-client-secret"
PASSWORD = "provider-pass-phrase-7"
OIDC_BACKEND = "chat.accounts.oidc_backend.OidcBackend"
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"
_addresses = itertools.count(1)


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    server = OidcProvider(tmp_path_factory.mktemp("oidc")).start()
    server.client(
        "chat",
        SECRET,
        redirect_uris=["http://testserver/accounts/oidc/callback/"],
        post_logout_uris=["http://testserver/"],
    )
    server.user("ada", PASSWORD, email="ada@example.com", groups=["chat-staff"])
    server.user("bob", PASSWORD, email="bob@example.com")
    yield server
    server.stop()


def chat_settings(spec: str) -> dict:
    """CHAT_OIDC=`spec` as project/settings.py turns it into settings."""
    keys = dict(item.split("=", 1) for item in spec.split(","))
    return product.oidc_settings({**product.OIDC_DEFAULTS, **keys})


@pytest.fixture
def oidc(settings, provider, empty_cache):
    """The chat signing in through `provider`, staff from chat-staff, superusers from
    chat-admins, with local accounts as well (the default)."""
    spec = provider.spec("chat", SECRET, staff_groups="chat-staff", superuser_groups="chat-admins")
    for name, value in chat_settings(spec).items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [MODEL_BACKEND, OIDC_BACKEND]
    settings.REDIS_URL = TEST_CACHE_URL  # throttle counts in the emptied test database
    oidc_provider.forget()
    yield provider
    oidc_provider.forget()


def browser() -> Client:
    """A chat client from its own address: one test's failed sign-ins never throttle another's."""
    n = next(_addresses)
    return Client(REMOTE_ADDR=f"10.77.{n // 250}.{n % 250}")


def sign_in(
    client: Client, username: str, *, at_provider: requests.Session | None = None, next: str = ""
):
    """The whole code flow: the chat's start, the provider's form, the chat's callback."""
    start = client.get("/accounts/oidc/start/", {"next": next} if next else {})
    assert start.status_code == 302, start.content
    callback = provider_sign_in(start["Location"], username, PASSWORD, at_provider)
    assert callback.startswith("http://testserver/accounts/oidc/callback/?"), callback
    return client.get(callback.removeprefix("http://testserver"))


def test_the_first_sign_in_makes_the_account_with_staff_from_the_group(oidc):
    """ada (in chat-staff) gets an account of her own name, linked to her subject, staff and
    into /admin/; bob (in no group) gets one too, and not into /admin/."""
    ada = browser()
    response = sign_in(ada, "ada")
    assert response.status_code == 302 and response["Location"] == "/"
    user = User.objects.get(username="ada")
    assert (user.email, user.is_staff, user.is_superuser) == ("ada@example.com", True, False)
    assert not user.has_usable_password()
    identity = OidcIdentity.objects.get(user=user)
    assert identity.issuer == oidc.issuer and identity.subject
    assert 'id="signed-in-as">ada<' in ada.get("/").content.decode()
    assert ada.get("/admin/").status_code == 200

    bob = browser()
    assert sign_in(bob, "bob").status_code == 302
    assert not User.objects.get(username="bob").is_staff
    assert bob.get("/admin/")["Location"].startswith("/admin/login/")


def test_the_mapping_is_applied_again_at_every_sign_in(oidc):
    """Out of the group at the provider, out of staff at the next sign-in; into chat-admins,
    superuser (and staff). The same account every time."""
    oidc.user("cy", PASSWORD, groups=["chat-staff"])
    sign_in(browser(), "cy")
    first = User.objects.get(username="cy")
    assert first.is_staff and not first.is_superuser
    oidc.user("cy", PASSWORD, groups=[])
    sign_in(browser(), "cy")
    assert not User.objects.get(pk=first.pk).is_staff
    oidc.user("cy", PASSWORD, groups=["chat-admins"])
    client = browser()
    sign_in(client, "cy")
    again = User.objects.get(pk=first.pk)
    assert again.is_staff and again.is_superuser
    assert User.objects.filter(username__startswith="cy").count() == 1
    assert client.get("/admin/auth/user/").status_code == 200


def test_sign_in_rotates_the_session_and_takes_the_visitors_conversations(oidc):
    """As a password sign-in: a new session key (a fixed one cannot be carried over), and what
    the visitor wrote moves into the account."""
    client = browser()
    client.get("/")
    visitor_key = client.session.session_key
    conversation = Conversation.objects.create(session_key=visitor_key, title="Before")
    sign_in(client, "bob")
    assert client.session.session_key != visitor_key
    conversation.refresh_from_db()
    assert conversation.user == User.objects.get(username="bob")


def test_a_local_account_with_the_same_name_and_address_is_never_taken_over(oidc):
    """The provider's "eve" gets an account of her own beside the local eve, whose password and
    rights stay hers."""
    local = User.objects.create_user("eve", email="eve@example.com", password="local-eve-pass")
    oidc.user("eve", PASSWORD, email="eve@example.com", groups=["chat-admins"])
    sign_in(browser(), "eve")
    local.refresh_from_db()
    assert local.check_password("local-eve-pass") and not local.is_superuser
    made = OidcIdentity.objects.get(issuer=oidc.issuer).user
    assert made.pk != local.pk and made.username.startswith("eve-") and made.is_superuser


def started_state(client: Client) -> str:
    """A sign-in started at the chat: the state the provider would send back."""
    start = client.get("/accounts/oidc/start/")
    return parse_qs(urlsplit(start["Location"]).query)["state"][0]


def test_failed_sign_ins_count_like_wrong_passwords_and_are_throttled(oidc):
    """A refused authorization and a code the provider does not know each show a readable page
    and count for the address; past the limit the provider's sign-in and the password form are
    both refused."""
    client = browser()
    denied = client.get(
        f"/accounts/oidc/callback/?error=access_denied&state={started_state(client)}"
    )
    assert denied.status_code == 403
    assert "Signing in with Loopback ID did not work" in denied.content.decode()
    for _ in range(signin_address_limiter.limit - 1):
        guessed = client.get(f"/accounts/oidc/callback/?code=guessed&state={started_state(client)}")
        assert guessed.status_code == 403  # the provider refused the code
    refused = client.get("/accounts/oidc/start/")
    assert refused.status_code == 429
    assert "Too many failed sign-in attempts" in refused.content.decode()
    User.objects.create_user("local", password="a-long-pass-phrase-42")
    password = client.post(
        "/accounts/login/", {"username": "local", "password": "a-long-pass-phrase-42"}
    )
    assert "Too many failed sign-in attempts" in password.content.decode()
    assert browser().get("/accounts/oidc/start/").status_code == 302  # another address is not


def test_a_callback_this_browser_never_started_is_refused_and_not_counted(oidc):
    """A forged or replayed state exchanges no code and counts nothing: a page the visitor opens
    cannot lock their address out by pointing at the callback."""
    client = browser()
    for _ in range(signin_address_limiter.limit + 1):
        forged = client.get("/accounts/oidc/callback/?code=x&state=not-mine")
        assert forged.status_code == 403
        assert "not started in this browser" in forged.content.decode()
    callback = provider_sign_in(
        client.get("/accounts/oidc/start/")["Location"], "bob", PASSWORD
    ).removeprefix("http://testserver")
    assert client.get(callback)["Location"] == "/"  # still allowed in
    replayed = client.get(callback)  # the same state and code again
    assert "not started in this browser" in replayed.content.decode()


def test_signing_out_ends_the_providers_session_too(oidc):
    """Sign-out ends the chat's session and sends the browser to the provider's
    end_session_endpoint with the ID token as hint; the provider then asks for the password
    again."""
    client, at_provider = browser(), requests.Session()
    sign_in(client, "ada", at_provider=at_provider)
    response = client.post("/accounts/logout/")
    assert response.status_code == 302
    end_session = response["Location"]
    assert end_session.startswith(f"{oidc.issuer}/logout/?") and "id_token_hint=" in end_session
    assert "_auth_user_id" not in client.session
    back = at_provider.get(end_session, allow_redirects=False, timeout=30)
    assert back.status_code == 302 and back.headers["Location"] == "http://testserver/"
    start = client.get("/accounts/oidc/start/")
    again = at_provider.get(start["Location"], allow_redirects=False, timeout=30)
    assert "/accounts/login/" in again.headers["Location"]  # signed out there as well


def test_a_provider_that_cannot_be_reached_gives_a_readable_page(settings, oidc):
    """Discovery fails with the issuer and the reason on the page (503), not a 500; signing out
    of a session from before still ends it here."""
    client = browser()
    sign_in(client, "ada")
    closed = f"http://127.0.0.1:{free_port()}/o"  # nothing listens there
    settings.CHAT_OIDC = {**settings.CHAT_OIDC, "issuer": closed}
    response = browser().get("/accounts/oidc/start/")
    assert response.status_code == 503
    page = response.content.decode()
    assert f"cannot read {closed}/.well-known/openid-configuration: ConnectionError" in page
    assert client.post("/accounts/logout/")["Location"] == "/"
    assert "_auth_user_id" not in client.session


def test_with_local_accounts_off_the_password_form_is_gone_and_refused(settings, oidc):
    """CHAT_LOCAL_ACCOUNTS=0: the sign-in page offers the provider only; posting a right
    password there or to the admin is refused (403), as are sign-up and password reset; the
    admin's sign-in sends a visitor to the provider's button."""
    settings.CHAT_LOCAL_ACCOUNTS = False
    settings.AUTHENTICATION_BACKENDS = [OIDC_BACKEND]
    User.objects.create_user("old", password="a-long-pass-phrase-42", is_staff=True)
    client = browser()
    page = client.get("/accounts/login/").content.decode()
    assert 'type="password"' not in page and "Sign in with Loopback ID" in page
    assert 'id="sign-up"' not in client.get("/").content.decode()
    for path in ("/accounts/login/", "/admin/login/"):
        refused = client.post(path, {"username": "old", "password": "a-long-pass-phrase-42"})
        assert refused.status_code == 403
        assert "signed in through Loopback ID only" in refused.content.decode()
    assert "_auth_user_id" not in client.session
    assert client.get("/accounts/signup/").status_code == 403
    assert client.post("/accounts/password_reset/", {"email": "x@example.com"}).status_code == 403
    assert (
        client.get("/admin/login/?next=/admin/")["Location"] == "/accounts/login/?next=%2Fadmin%2F"
    )
    assert sign_in(client, "ada").status_code == 302  # the provider still signs in
    assert client.get("/admin/").status_code == 200


def test_an_account_from_the_provider_can_delete_itself(oidc):
    """It has no password here: typing its user name confirms instead, and a wrong name does
    not."""
    client = browser()
    sign_in(client, "bob")
    assert "Type your user name to confirm" in client.get("/account/delete/").content.decode()
    assert client.post("/account/delete/", {"password": "not-bob"}).status_code == 400
    assert client.post("/account/delete/", {"password": "bob"})["Location"] == "/account/deleted/"
    assert not User.objects.filter(username="bob").exists()
    assert not OidcIdentity.objects.filter(user__username="bob").exists()


def test_the_page_asked_for_is_where_the_sign_in_lands_if_it_is_on_this_site(oidc):
    """`next` survives the trip to the provider (the admin's sign-in sends it); another site's
    address is dropped for the front page."""
    assert sign_in(browser(), "ada", next="/admin/")["Location"] == "/admin/"
    assert sign_in(browser(), "ada", next="https://evil.example/")["Location"] == "/"
    admin_sign_in = browser().get("/admin/login/?next=/admin/auth/user/")
    assert admin_sign_in["Location"] == "/accounts/login/?next=%2Fadmin%2Fauth%2Fuser%2F"


def test_an_account_deactivated_here_stays_out(oidc):
    """The provider vouching for a user does not reopen an account staff closed in the admin:
    refused, and counted against the account."""
    sign_in(browser(), "bob")
    User.objects.filter(username="bob").update(is_active=False)
    client = browser()
    refused = sign_in(client, "bob")
    assert refused.status_code == 403 and "_auth_user_id" not in client.session
    assert signin_account_limiter.wait("bob") == 0  # one failure, under the limit
    for _ in range(signin_account_limiter.limit - 1):
        sign_in(browser(), "bob")
    assert signin_account_limiter.wait("bob") > 0


def use_provider(settings, spec: str) -> None:
    for name, value in chat_settings(spec).items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [MODEL_BACKEND, OIDC_BACKEND]
    settings.REDIS_URL = TEST_CACHE_URL
    oidc_provider.forget()


def test_a_provider_that_signs_without_kid_signs_users_in(settings, empty_cache, tmp_path):
    """OpenID Connect Core lets a provider with one key leave `kid` out of the ID token's
    header; the library's key lookup then raised KeyError, a 500 at every sign-in."""
    provider = OidcProvider(tmp_path, kid=False).start()
    try:
        provider.client(
            "chat",
            SECRET,
            redirect_uris=["http://testserver/accounts/oidc/callback/"],
            post_logout_uris=["http://testserver/"],
        )
        provider.user("kit", PASSWORD, email="kit@example.com")
        use_provider(settings, provider.spec("chat", SECRET))
        client = browser()
        response = sign_in(client, "kit")
        assert response.status_code == 302 and response["Location"] == "/", response.content[:500]
        assert 'id="signed-in-as">kit<' in client.get("/").content.decode()
    finally:
        provider.stop()
        oidc_provider.forget()


@pytest.fixture
def independent_provider(settings, empty_cache, monkeypatch):
    """oidc-provider-mock (authlib in a thread here): a provider written by others, whose one
    RS256 key has no kid, in its JWKS or in the ID tokens it signs."""
    from oidc_provider_mock import run_server_in_thread  # type: ignore[import-untyped]

    monkeypatch.setenv("AUTHLIB_INSECURE_TRANSPORT", "1")  # it serves plain http on loopback
    with run_server_in_thread(require_nonce=True) as server:
        issuer = f"http://localhost:{server.server_port}"
        use_provider(settings, f"issuer={issuer},client_id=chat,secret={SECRET},name=Mock")
        yield issuer
    oidc_provider.forget()


def independent_sign_in(client: Client, subject: str):
    start = client.get("/accounts/oidc/start/")
    assert start.status_code == 302, start.content
    consent = requests.post(start["Location"], data={"sub": subject}, allow_redirects=False)
    assert consent.status_code == 302, consent.text[:500]
    return client.get(consent.headers["Location"].removeprefix("http://testserver"))


def test_an_independent_provider_signs_users_in(independent_provider):
    """The whole code flow against a provider this suite did not write: the account is made,
    linked to the issuer and subject, and signed in."""
    client = browser()
    response = independent_sign_in(client, "lin@example.com")
    assert response.status_code == 302 and response["Location"] == "/", response.content[:500]
    identity = OidcIdentity.objects.get(subject="lin@example.com")
    assert identity.issuer == independent_provider
    assert identity.user.email == "lin@example.com"
    assert client.session["_auth_user_id"] == str(identity.user.pk)
