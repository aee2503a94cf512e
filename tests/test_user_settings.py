"""The settings page a user owns (/settings/): custom instructions and the policy new chats start
with, the e-mail address and password; sign-up's e-mail; the API keys page's confirm step; and
the rule that a user's instructions are part of their answers' identity. Django's test client,
the test database and Redis; prompts prepared on a scripted backend (harness/scripted.py)."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from chat.models import ChatSettings, Message
from chat.models.user_settings import MAX_INSTRUCTIONS_CHARS
from chat.protocol import CONTINUABLE, Prompt
from chat.stores import user_settings
from chat.stores.apikeys import apikey_create
from chat.stores.erasure import account_erase
from chat.stores.policy_store import PolicyOverride
from chat.stores.selectors import Owner
from chat.turns.continuation import prepare_continue
from chat.turns.prepare import Given, prepare_prompt
from harness.scripted import ScriptedBackend
from tests.conftest import TEST_CACHE_URL

pytestmark = [pytest.mark.unit, pytest.mark.django_db]

PASSWORD = "a-long-pass-phrase-42"
NOTE = "Answer in French, and end with the word VOILA."
_addresses = itertools.count(1)


@pytest.fixture(autouse=True)
def fresh_counts(settings, empty_cache):
    """Sign-in and sign-up throttles count in the test Redis database, emptied per test."""
    settings.REDIS_URL = TEST_CACHE_URL


def browser(user=None) -> Client:
    """A client from its own address (the per-address throttles), signed in as `user` if given."""
    n = next(_addresses)
    client = Client(REMOTE_ADDR=f"10.23.{n // 250}.{n % 250}")
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def ada():
    return User.objects.create_user("ada", "ada@example.org", PASSWORD)


def owner(user) -> Owner:
    return Owner(user_id=user.pk, session_key="")


def noted(user, note: str = NOTE) -> None:
    ChatSettings.objects.update_or_create(user=user, defaults={"instructions": note})


# -- the page ------------------------------------------------------------------------


def test_a_visitor_is_told_to_sign_in_to_keep_settings():
    client = browser()
    page = client.get("/settings/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="settings-sign-in"' in text and "Sign in to keep settings" in text
    assert "/accounts/login/?next=/settings/" in text
    refused = client.post("/settings/", {"section": "chat", "chat-instructions": "x"})
    assert refused.status_code == 403 and not ChatSettings.objects.exists()


def test_custom_instructions_and_the_default_policy_are_saved(ada, example_policies):
    client = browser(ada)
    page = client.get("/settings/").content.decode()
    assert 'id="chat-settings"' in page and "autofocus" not in page  # opens at its top
    saved = client.post(
        "/settings/",
        {
            "section": "chat",
            "chat-instructions": NOTE,
            "chat-default_policy": example_policies["json"].pk,
        },
    )
    assert saved.status_code == 302 and saved["Location"] == "/settings/?saved=chat"
    stored = ChatSettings.objects.get(user=ada)
    assert stored.instructions == NOTE and stored.default_policy.slug == "json"
    assert "Chat settings saved" in client.get(saved["Location"]).content.decode()
    # The chat page's picker starts on it, and New chat goes back to it.
    chat_page = client.get("/").content.decode()
    assert re.search(r'<option value="json"[^>]* selected', chat_page)
    assert 'data-start="json"' in chat_page


def test_instructions_over_the_limit_are_refused_by_the_field_and_nothing_changes(ada):
    noted(ada, "Be brief.")
    client = browser(ada)
    too_long = "x" * (MAX_INSTRUCTIONS_CHARS + 1)
    refused = client.post("/settings/", {"section": "chat", "chat-instructions": too_long})
    assert refused.status_code == 400
    text = refused.content.decode()
    assert 'id="id_chat-instructions_error"' in text
    assert f"at most {MAX_INSTRUCTIONS_CHARS} characters; these are {len(too_long)}" in text
    assert too_long in text  # what was typed is still there to shorten
    assert ChatSettings.objects.get(user=ada).instructions == "Be brief."


def test_a_deleted_default_policy_falls_back_to_the_sites(ada, example_policies):
    ChatSettings.objects.create(user=ada, default_policy=example_policies["json"])
    assert user_settings.policy_for(owner(ada), None).slug == "json"
    assert user_settings.policy_for(owner(ada), "chat").slug == "chat"  # a named one wins
    example_policies["json"].delete()
    assert ChatSettings.objects.get(user=ada).default_policy is None
    assert user_settings.policy_for(owner(ada), None).slug == "chat"  # the site's default
    page = browser(ada).get("/").content.decode()
    assert re.search(r'<option value="chat"[^>]* selected', page)
    assert browser(ada).get("/settings/").status_code == 200


def test_the_email_changes_with_the_password_and_stays_unique_in_any_case(ada):
    User.objects.create_user("bob", "Bob@Example.org", PASSWORD)
    client = browser(ada)
    wrong = client.post(
        "/settings/",
        {"section": "email", "email-email": "ada@new.example", "email-password": "nope"},
    )
    assert wrong.status_code == 400 and "That is not your password." in wrong.content.decode()
    taken = client.post(
        "/settings/",
        {"section": "email", "email-email": "bob@EXAMPLE.org", "email-password": PASSWORD},
    )
    assert taken.status_code == 400
    assert "Another account already uses this e-mail address." in taken.content.decode()
    # The refused address is not shown as the account's anywhere on the page.
    assert 'value="ada@example.org"' not in taken.content.decode().split("email-settings")[0]
    ada.refresh_from_db()
    assert ada.email == "ada@example.org"
    same = client.post(  # one's own address in another case is no clash
        "/settings/",
        {"section": "email", "email-email": "ADA@example.org", "email-password": PASSWORD},
    )
    assert same.status_code == 302
    ada.refresh_from_db()
    assert ada.email == "ADA@example.org"


def test_a_password_mismatch_keeps_the_other_passwords_and_names_the_field(ada):
    client = browser(ada)
    new = "another-long-pass-phrase-7"
    mismatch = client.post(
        "/settings/",
        {
            "section": "password",
            "password-old_password": PASSWORD,
            "password-new_password1": new,
            "password-new_password2": new + "x",
        },
    )
    assert mismatch.status_code == 400
    text = mismatch.content.decode()
    confirm = re.search(r'<input[^>]*name="password-new_password2"[^>]*>', text).group(0)
    assert "value=" not in confirm and "autofocus" in confirm
    assert (
        'aria-describedby="id_password-new_password2_helptext id_password-new_password2_error"'
        in confirm
    )
    assert 'id="id_password-new_password2_error"' in text  # the error the input names
    assert re.search(rf'<input[^>]*name="password-new_password1"[^>]*value="{new}"', text)
    assert re.search(rf'<input[^>]*name="password-old_password"[^>]*value="{PASSWORD}"', text)
    changed = client.post(
        "/settings/",
        {
            "section": "password",
            "password-old_password": PASSWORD,
            "password-new_password1": new,
            "password-new_password2": new,
        },
    )
    assert changed.status_code == 302
    ada.refresh_from_db()
    assert ada.check_password(new)
    assert client.get("/settings/").status_code == 200  # this browser is still signed in
    assert 'id="settings-user">ada<' in client.get("/settings/").content.decode()


def test_an_unknown_section_is_refused():
    user = User.objects.create_user("cy", "", PASSWORD)
    assert browser(user).post("/settings/", {"section": "nope"}).status_code == 400


def test_the_top_bar_links_settings_not_deletion_and_staff_see_the_admin(ada):
    page = browser(ada).get("/").content.decode()
    assert 'id="account-settings"' in page
    assert 'id="account-delete"' not in page and "Delete account" not in page
    assert 'id="admin-link"' not in page
    ada.is_staff = True
    ada.save()
    assert 'id="admin-link" ' in browser(ada).get("/").content.decode().replace(">", " >")
    settings_page = browser(ada).get("/settings/").content.decode()
    assert 'id="account-delete"' in settings_page and 'href="/account/delete/"' in settings_page


# -- sign-up -------------------------------------------------------------------------


def signup(client: Client, username: str, email: str = "", password2: str = PASSWORD):
    return client.post(
        "/accounts/signup/",
        {"username": username, "email": email, "password1": PASSWORD, "password2": password2},
    )


def test_sign_up_takes_an_optional_email_unique_in_any_case():
    assert signup(browser(), "ada").status_code == 302  # without one
    assert User.objects.get(username="ada").email == ""
    assert signup(browser(), "bob", "Bob@Example.org").status_code == 302
    taken = signup(browser(), "bobby", "bob@example.ORG")
    assert taken.status_code == 200 and not User.objects.filter(username="bobby").exists()
    assert "Another account already uses this e-mail address." in taken.content.decode()
    bad = signup(browser(), "carl", "not-an-address")
    assert "Enter a valid email address." in bad.content.decode()
    # A password reset reaches the account that gave the address, typed in any case.
    browser().post("/accounts/password_reset/", {"email": "BOB@example.org"})
    assert [m.to for m in mail.outbox] == [["Bob@example.org"]]  # its domain in lower case


def test_a_sign_up_password_mismatch_keeps_the_rest():
    refused = signup(browser(), "dora", "dora@example.org", password2=PASSWORD + "!")
    text = refused.content.decode()
    assert refused.status_code == 200 and not User.objects.filter(username="dora").exists()
    assert 'value="dora"' in text and 'value="dora@example.org"' in text
    assert re.search(rf'<input[^>]*name="password1"[^>]*value="{PASSWORD}"', text)
    confirm = re.search(r'<input[^>]*name="password2"[^>]*>', text).group(0)
    assert "value=" not in confirm and "autofocus" in confirm
    assert 'id="id_password2_error"' in text and "didn’t match" in text


def test_a_sign_up_with_a_weak_password_keeps_no_password():
    """Only a mismatch keeps the first password: a refused one is typed again."""
    client = browser()
    text = client.post(
        "/accounts/signup/",
        {"username": "eve", "password1": "123", "password2": "123"},
    ).content.decode()
    assert not re.search(r'<input[^>]*name="password1"[^>]*value=', text)


# -- export and deletion ---------------------------------------------------------------


def test_the_export_has_the_settings_and_the_deletion_removes_them(ada, example_policies):
    ChatSettings.objects.create(
        user=ada, instructions=NOTE, default_policy=example_policies["json"]
    )
    client = browser(ada)
    exported = json.loads(client.get("/account/export?format=json").content)
    assert exported["settings"] == {"custom_instructions": NOTE, "default_policy": "json"}
    markdown = client.get("/account/export?format=markdown").content.decode()
    assert f"> {NOTE}" in markdown and "`json`" in markdown
    account_erase(user=ada)
    assert not ChatSettings.objects.exists()


# -- API keys page ---------------------------------------------------------------------


def test_revoking_a_key_is_asked_in_the_page_and_revoked_keys_are_folded_away(ada):
    key, _ = apikey_create(user=ada, name="laptop")
    client = browser(ada)
    listing = client.get("/account/api-keys/").content.decode()
    assert f'href="?revoke={key.pk}#confirm-revoke"' in listing
    assert 'name="revoke"' not in listing  # no revoke without the question first
    asked = client.get(f"/account/api-keys/?revoke={key.pk}").content.decode()
    assert 'id="confirm-revoke"' in asked and "Revoke the key laptop" in asked
    key.refresh_from_db()
    assert key.is_active  # asking changed nothing
    assert client.post("/account/api-keys/", {"revoke": "", "key": key.pk}).status_code == 302
    after = client.get("/account/api-keys/").content.decode()
    assert 'id="revoked-keys"' in after and "Revoked (1)" in after
    assert "No active keys." in after
    assert (
        'id="confirm-revoke"'
        not in client.get(f"/account/api-keys/?revoke={key.pk}").content.decode()
    )


# -- the identity rule -----------------------------------------------------------------


def prepared(user, text: str = "Hello there", given: Given | None = None, policy=None):
    backend = ScriptedBackend([])
    prompt = Prompt(request_id="r", text=text, conversation=None, policy=policy)
    return prepare_prompt(owner(user), prompt, backend, given or Given())


def test_custom_instructions_are_read_by_the_model_and_part_of_the_answers_identity():
    """One prompt, three users: the one with instructions gets an identity of their own, so
    their instructed answer is never served to the others, nor theirs to them; two users with
    the same instructions ask the same thing and may share."""
    plain, instructed, same = (User.objects.create_user(n, "", PASSWORD) for n in "pis")
    noted(instructed)
    noted(same)
    a, b, c = prepared(plain), prepared(instructed), prepared(same)
    assert NOTE not in a.rendered and all(m["role"] != "system" for m in a.messages)
    assert b.messages[0] == {"role": "system", "content": NOTE} and NOTE in b.rendered
    assert a.identity and b.identity and a.identity != b.identity
    assert b.identity == c.identity
    noted(same, NOTE + " ")  # spaces at the ends are not read
    assert prepared(same).identity == b.identity
    noted(same, "Answer in German.")
    assert prepared(same).identity not in (a.identity, b.identity)


def test_instructions_follow_the_policys_system_prompt(make_policy):
    make_policy(slug="brief", system_prompt="Be brief.")
    user = User.objects.create_user("p", "", PASSWORD)
    noted(user)
    assert prepared(user, policy="brief").messages[0] == {
        "role": "system",
        "content": f"Be brief.\n\n{NOTE}",
    }


def test_v1_requests_do_not_read_the_users_instructions(example_policies):
    user = User.objects.create_user("k", "", PASSWORD)
    noted(user)
    ChatSettings.objects.filter(user=user).update(default_policy=example_policies["json"])
    assert prepared(user).policy.slug == "json"  # the page's and /api's prompt naming none
    key, _ = apikey_create(user=user)
    v1 = prepared(user, given=Given(override=PolicyOverride(), api_key_id=key.pk))
    assert all(NOTE not in m["content"] for m in v1.messages)
    assert v1.policy.slug == "chat"  # the site's default, not the user's page choice


def test_a_continue_reads_the_instructions_and_keeps_its_identity_only_while_they_are_the_same():
    user = User.objects.create_user("q", "", PASSWORD)
    noted(user)
    first = prepared(user)

    def cut_off_and_continue():
        Message.objects.filter(pk=first.assistant.pk).update(
            status=Message.Status.DONE, finish_reason=CONTINUABLE, text="Bonjour"
        )
        prompt = Prompt(
            request_id="c", text="", conversation=None, policy=None, continues=first.assistant.pk
        )
        return prepare_continue(owner(user), prompt, ScriptedBackend([]))

    going_on = cut_off_and_continue()
    assert going_on.messages[0] == {"role": "system", "content": NOTE}
    assert going_on.identity == first.identity
    noted(user, "Answer in German.")  # changed since: the whole would not be what it names
    assert cut_off_and_continue().identity is None


def test_an_account_without_a_password_here_has_its_address_shown_not_changed():
    """An account the OpenID Connect provider signs in: the provider keeps its address, and it
    has no password here to change or to confirm a change with."""
    user = User.objects.create_user("oi", "oi@provider.example")
    user.set_unusable_password()
    user.save()
    client = browser(user)
    page = client.get("/settings/").content.decode()
    assert 'id="email-managed"' in page and "oi@provider.example" in page
    assert 'id="email-settings"' not in page and 'id="password-settings"' not in page
    assert client.post("/settings/", {"section": "email"}).status_code == 400
    assert (
        client.post("/settings/", {"section": "chat", "chat-instructions": NOTE}).status_code == 302
    )


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/accounts/signup/", {"username": "fay", "password1": PASSWORD, "password2": "other"}),
        (
            "/accounts/password_change/",
            {"old_password": PASSWORD, "new_password1": PASSWORD + "1", "new_password2": "x"},
        ),
        (
            "/settings/",
            {
                "section": "password",
                "password-old_password": PASSWORD,
                "password-new_password1": PASSWORD + "1",
                "password-new_password2": "x",
            },
        ),
    ],
)
def test_an_answer_holding_typed_passwords_is_never_stored(ada, path, fields):
    client = browser(None if "signup" in path else ada)
    response = client.post(path, fields)
    assert PASSWORD in response.content.decode()  # kept, for the mismatch
    assert "no-store" in response["Cache-Control"]
