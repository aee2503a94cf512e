"""Accounts: sign up, sign in (throttled, here and in the admin), sign out, password reset,
and a visitor's conversations moving into the account."""

import itertools
import re

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from chat.infra.ratelimit import signin_address_limiter, signup_limiter
from chat.models import Conversation, Message
from tests.conftest import TEST_CACHE_URL

pytestmark = [pytest.mark.unit, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def fresh_counts(settings, empty_cache):
    """Throttle counts in the test Redis database, which `empty_cache` empties before each test."""
    settings.REDIS_URL = TEST_CACHE_URL


PASSWORD = "a-long-pass-phrase-42"
_addresses = itertools.count(1)


def browser() -> Client:
    """A client from its own address, so the per-address counts of one test never touch another's."""
    n = next(_addresses)
    return Client(REMOTE_ADDR=f"10.14.{n // 250}.{n % 250}")


def visitor_with_a_conversation(client: Client) -> Conversation:
    client.get("/")
    conversation = Conversation.objects.create(session_key=client.session.session_key, title="Mine")
    Message.objects.create(conversation=conversation, role="user", text="hello")
    Message.objects.create(conversation=conversation, role="assistant", text="hi there")
    return conversation


def test_sign_up_signs_in_and_adopts_the_visitors_conversations():
    """A new account is signed in at once and owns what the visitor wrote, messages and all."""
    client = browser()
    conversation = visitor_with_a_conversation(client)
    response = client.post(
        "/accounts/signup/",
        {"username": "ada", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert response.status_code == 302 and response["Location"] == "/"
    user = User.objects.get(username="ada")
    conversation.refresh_from_db()
    assert conversation.user == user and conversation.session_key == ""
    assert conversation.messages.count() == 2
    page = client.get("/").content.decode()
    assert 'id="signed-in-as">ada<' in page and "Mine" in page
    assert client.get(f"/api/conversations/{conversation.pk}/").status_code == 200


def test_sign_in_adopts_the_visitors_conversations_and_sign_out_leaves_them_in_the_account():
    client = browser()
    user = User.objects.create_user("grace", password=PASSWORD)
    conversation = visitor_with_a_conversation(client)
    response = client.post("/accounts/login/", {"username": "grace", "password": PASSWORD})
    assert response.status_code == 302
    conversation.refresh_from_db()
    assert conversation.user == user
    client.post("/accounts/logout/")
    assert client.get(f"/api/conversations/{conversation.pk}/").status_code == 404
    other = browser()
    other.post("/accounts/login/", {"username": "grace", "password": PASSWORD})
    listed = other.get("/api/conversations/").json()["conversations"]
    assert [c["id"] for c in listed] == [conversation.pk]


def test_another_visitors_conversations_are_not_adopted():
    client, stranger = browser(), browser()
    theirs = visitor_with_a_conversation(stranger)
    User.objects.create_user("alan", password=PASSWORD)
    client.get("/")
    client.post("/accounts/login/", {"username": "alan", "password": PASSWORD})
    theirs.refresh_from_db()
    assert theirs.user is None and theirs.session_key


def test_closed_sign_up_is_refused_and_not_offered(settings):
    settings.CHAT_SIGNUP = "closed"
    client = browser()
    response = client.post(
        "/accounts/signup/", {"username": "eve", "password1": PASSWORD, "password2": PASSWORD}
    )
    assert response.status_code == 403
    assert not User.objects.filter(username="eve").exists()
    assert 'id="sign-up"' not in client.get("/").content.decode()
    assert "Create an account" not in client.get("/accounts/login/").content.decode()


def test_password_reset_mails_a_link_that_sets_a_new_password():
    User.objects.create_user("linus", email="linus@example.org", password=PASSWORD)
    client = browser()
    client.post("/accounts/password_reset/", {"email": "linus@example.org"})
    assert len(mail.outbox) == 1
    link = re.search(r"http://testserver(/accounts/reset/\S+/)", mail.outbox[0].body).group(1)
    form = client.get(link, follow=True)
    assert form.status_code == 200
    new = "another-long-pass-phrase-7"
    done = client.post(
        form.redirect_chain[-1][0], {"new_password1": new, "new_password2": new}, follow=True
    )
    assert b"Password set" in done.content
    assert browser().login(username="linus", password=new)


def test_password_change_needs_sign_in_and_changes_it():
    client = browser()
    assert client.get("/accounts/password_change/").status_code == 302
    User.objects.create_user("barbara", password=PASSWORD)
    client.post("/accounts/login/", {"username": "barbara", "password": PASSWORD})
    new = "changed-pass-phrase-99"
    response = client.post(
        "/accounts/password_change/",
        {"old_password": PASSWORD, "new_password1": new, "new_password2": new},
    )
    assert response.status_code == 302
    assert browser().login(username="barbara", password=new)


@pytest.mark.parametrize("login_path", ["/accounts/login/", "/admin/login/"])
def test_thirty_wrong_passwords_then_the_right_one_is_refused_while_throttled(login_path):
    """Per account: after the limit even the right password is refused, with how long to wait."""
    User.objects.create_user("target", password=PASSWORD, is_staff=True)
    for _ in range(30):
        browser().post(login_path, {"username": "target", "password": "wrong"})
    response = browser().post(login_path, {"username": "target", "password": PASSWORD})
    assert response.status_code == 200  # the form again, not a redirect
    assert "Too many failed sign-in attempts; try again in 15 minutes." in response.content.decode()
    assert "_auth_user_id" not in response.wsgi_request.session


@pytest.mark.parametrize("login_path", ["/accounts/login/", "/admin/login/"])
def test_one_address_guessing_many_accounts_is_throttled(login_path):
    """Per address: spreading guesses over many user names does not get round the limit."""
    User.objects.create_user("victim", password=PASSWORD, is_staff=True)
    client = browser()
    for n in range(signin_address_limiter.limit):
        client.post(login_path, {"username": f"guess{n}", "password": "wrong"})
    response = client.post(login_path, {"username": "victim", "password": PASSWORD})
    assert "Too many failed sign-in attempts" in response.content.decode()
    # From another address the account itself is not locked.
    assert (
        browser().post(login_path, {"username": "victim", "password": PASSWORD}).status_code == 302
    )


def test_a_right_password_clears_the_accounts_count():
    User.objects.create_user("kay", password=PASSWORD)
    for _ in range(4):
        browser().post("/accounts/login/", {"username": "kay", "password": "wrong"})
    assert (
        browser().post("/accounts/login/", {"username": "kay", "password": PASSWORD}).status_code
        == 302
    )
    for _ in range(4):
        browser().post("/accounts/login/", {"username": "kay", "password": "wrong"})
    assert (
        browser().post("/accounts/login/", {"username": "kay", "password": PASSWORD}).status_code
        == 302
    )


def sign_up(client: Client, username: str, **extra):
    return client.post(
        "/accounts/signup/",
        {"username": username, "password1": PASSWORD, "password2": PASSWORD, **extra},
    )


def test_one_address_makes_five_accounts_an_hour_then_is_refused(settings):
    """The probe made 5 accounts in 2.4 s from one address, each with its own prompt limit; now
    the sixth is refused (429, the form with how long to wait) and the count is per address."""
    assert settings.CHAT_RATE_LIMITS["signup_address"] == (5, 3600)
    address = browser().defaults["REMOTE_ADDR"]
    for n in range(5):
        assert sign_up(Client(REMOTE_ADDR=address), f"mass{n}").status_code == 302
    refused = sign_up(Client(REMOTE_ADDR=address), "mass5")
    assert refused.status_code == 429
    assert "Too many accounts were made from your address; try again in 60 minutes." in (
        refused.content.decode()
    )
    assert not User.objects.filter(username="mass5").exists()
    assert sign_up(browser(), "elsewhere").status_code == 302  # another address is not counted


def test_a_form_with_errors_does_not_count_against_the_address(monkeypatch):
    monkeypatch.setattr(signup_limiter, "limit", 1)
    client = browser()
    bad = client.post("/accounts/signup/", {"username": "x", "password1": "a", "password2": "b"})
    assert bad.status_code == 200
    assert sign_up(client, "counted").status_code == 302


def test_confirm_mode_mails_a_link_and_the_account_opens_only_through_it(settings):
    """CHAT_SIGNUP=confirm: the account is inactive (cannot sign in) until the mailed link is
    followed and its button pressed; in the browser that signed up that signs in, adopts the
    browser's chats, and works once."""
    settings.CHAT_SIGNUP = "confirm"
    client = browser()
    conversation = visitor_with_a_conversation(client)
    assert 'id="sign-up"' in client.get("/").content.decode()
    missing = sign_up(client, "rosa")
    assert missing.status_code == 200 and not User.objects.filter(username="rosa").exists()
    sent = sign_up(client, "rosa", email="rosa@example.org")
    assert sent.status_code == 200 and b"rosa@example.org" in sent.content
    user = User.objects.get(username="rosa")
    assert not user.is_active and user.email == "rosa@example.org"
    assert not browser().login(username="rosa", password=PASSWORD)
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["rosa@example.org"]
    link = re.search(r"http://testserver(/accounts/confirm/\S+/)", mail.outbox[0].body).group(1)
    assert client.get(link.replace("/confirm/", "/confirm/x")).status_code == 400
    opened = client.post(link)
    assert opened.status_code == 302 and opened["Location"] == "/"
    user.refresh_from_db()
    conversation.refresh_from_db()
    assert user.is_active and conversation.user == user
    assert 'id="signed-in-as">rosa<' in client.get("/").content.decode()
    assert browser().get(link).status_code == 400  # used once
    assert browser().login(username="rosa", password=PASSWORD)


def mailed_link() -> str:
    return re.search(r"http://testserver(/accounts/confirm/\S+/)", mail.outbox[-1].body).group(1)


def test_opening_the_link_is_a_page_with_a_button_not_a_sign_in(settings):
    """A GET (a mail scanner, a prefetch, a link someone else sent) opens nothing: the page has
    a form that POSTs with the CSRF token; a POST without the token is refused."""
    settings.CHAT_SIGNUP = "confirm"
    client = browser()
    sign_up(client, "nell", email="nell@example.org")
    page = client.get(mailed_link())
    assert page.status_code == 200
    assert re.search(
        rb'<form method="post"[^>]*>\s*<input type="hidden" name="csrfmiddlewaretoken"',
        page.content,
    )
    assert not User.objects.get(username="nell").is_active
    assert "_auth_user_id" not in client.session
    forged = Client(enforce_csrf_checks=True, REMOTE_ADDR="10.14.250.1")
    assert forged.post(mailed_link()).status_code == 403
    assert not User.objects.get(username="nell").is_active


def test_a_link_confirmed_in_another_browser_opens_the_account_but_takes_nothing(settings):
    """An attacker signs up, then sends a victim the unopened link: pressing its button in the
    victim's browser opens the attacker's account, but neither signs the victim in nor moves the
    victim's chats into it; the account's owner signs in with the password."""
    settings.CHAT_SIGNUP = "confirm"
    attacker = browser()
    sign_up(attacker, "mallory", email="mallory@example.org")
    victim = browser()
    victims_chat = visitor_with_a_conversation(victim)
    done = victim.post(mailed_link())
    assert done.status_code == 200 and b"mallory" in done.content
    assert User.objects.get(username="mallory").is_active
    assert "_auth_user_id" not in victim.session
    victims_chat.refresh_from_db()
    assert victims_chat.user is None and victims_chat.session_key == victim.session.session_key
    assert 'id="signed-in-as"' not in victim.get("/").content.decode()
    assert victim.post(mailed_link()).status_code == 400  # used
    assert browser().login(username="mallory", password=PASSWORD)


@pytest.mark.parametrize("uid", ["MTIz", "wrI", "OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5", "%%%"])
def test_a_forged_confirmation_link_is_refused_not_a_500(settings, uid):
    """ "wrI" is "²" in base64, the last a uid past any database id."""
    settings.CHAT_SIGNUP = "confirm"
    assert browser().get(f"/accounts/confirm/{uid}/abc-def/").status_code in (400, 404)
