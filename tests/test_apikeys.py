"""API keys: stored hashed, made and revoked by the command, the account page and the admin."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from chat.models import ApiKey, OidcIdentity
from chat.stores.apikeys import apikey_authenticate, apikey_create
from project import settings as product

pytestmark = [pytest.mark.unit, pytest.mark.django_db]


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password="pw-alice-1")


@pytest.fixture
def bob():
    return get_user_model().objects.create_user("bob", password="pw-bob-1")


def test_a_key_is_stored_only_as_its_hash_with_a_visible_prefix(alice):
    row, key = apikey_create(user=alice, name="laptop")
    assert key.startswith("sk-") and len(key) > 40
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key.startswith(row.prefix) and len(row.prefix) < 12
    stored = ApiKey.objects.values_list(flat=False).get(pk=row.pk)
    assert all(key not in str(value) for value in stored)


def test_authenticating_notes_the_last_use_and_refuses_revoked_keys_and_inactive_users(alice):
    row, key = apikey_create(user=alice)
    assert apikey_authenticate(key).pk == row.pk
    row.refresh_from_db()
    assert row.last_used_at is not None
    assert apikey_authenticate(key + "x") is None and apikey_authenticate("") is None
    alice.is_active = False
    alice.save()
    assert apikey_authenticate(key) is None


def test_the_command_creates_lists_and_revokes(alice):
    out = StringIO()
    call_command("apikey", "create", "--user", "alice", "--name", "deploy", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    assert apikey_authenticate(key).name == "deploy"
    listing = StringIO()
    call_command("apikey", "list", stdout=listing)
    line = listing.getvalue().strip()
    assert "alice" in line and "deploy" in line and "active" in line and key not in line
    key_id = line.split("\t")[0]
    call_command("apikey", "revoke", key_id, stdout=StringIO())
    assert apikey_authenticate(key) is None
    with pytest.raises(CommandError):
        call_command("apikey", "revoke", key_id, stdout=StringIO())
    with pytest.raises(CommandError):
        call_command("apikey", "create", "--user", "nobody", stdout=StringIO())


def test_the_account_page_shows_a_new_key_once_and_revokes_only_the_users_own(alice, bob):
    client = Client()
    assert client.get("/account/api-keys/").status_code == 302  # signed-out: to the login
    client.force_login(alice)
    made = client.post("/account/api-keys/", {"create": "", "name": "script"})
    assert made.status_code == 200 and made["Cache-Control"] == "no-store"
    key = made.context["new_key"]
    assert key in made.content.decode() and apikey_authenticate(key).user == alice
    again = client.get("/account/api-keys/")
    assert key not in again.content.decode() and "script" in again.content.decode()
    bobs, _ = apikey_create(user=bob)
    refused = client.post("/account/api-keys/", {"revoke": "", "key": str(bobs.pk)})
    assert refused.status_code == 400
    bobs.refresh_from_db()
    assert bobs.is_active
    mine = ApiKey.objects.get(user=alice)
    assert client.post("/account/api-keys/", {"revoke": "", "key": str(mine.pk)}).status_code == 302
    assert apikey_authenticate(key) is None


def test_staff_make_a_key_in_the_admin_and_see_it_once(admin_client, alice):
    response = admin_client.post(
        "/admin/chat/apikey/add/", {"user": alice.pk, "name": "ops"}, follow=True
    )
    shown = [str(m) for m in response.context["messages"]]
    key = next(m.split(": ")[-1] for m in shown if "shown only this once" in m)
    assert apikey_authenticate(key).user == alice
    row = ApiKey.objects.get(user=alice)
    admin_client.post(
        "/admin/chat/apikey/",
        {"action": "revoke", "_selected_action": [row.pk]},
    )
    assert apikey_authenticate(key) is None


# -- a key works only while its user could still sign in, and until it expires ------------------


def over_both_apis(key: str) -> tuple[dict, dict]:
    """The error bodies of `key` on /v1 (the models list) and /api (a rating): (v1, api); each
    must be a 401 invalid_api_key."""
    client = Client()
    headers = {"Authorization": f"Bearer {key}"}
    v1 = client.get("/v1/models", headers=headers)
    api = client.post(
        "/api/messages/999999/feedback",
        data=json.dumps({"rating": 1}),
        content_type="application/json",
        headers=headers,
    )
    assert (v1.status_code, api.status_code) == (401, 401), (v1.content, api.content)
    assert v1["WWW-Authenticate"] == api["WWW-Authenticate"] == "Bearer"
    v1_error, api_error = v1.json()["error"], api.json()
    assert v1_error["code"] == api_error["code"] == "invalid_api_key"
    return v1_error, api_error


def accepted(key: str) -> bool:
    return Client().get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200


@pytest.fixture
def provider_only(settings):
    """CHAT_OIDC on (as project/settings.py turns a spec into settings) and CHAT_LOCAL_ACCOUNTS=0."""
    spec = {"issuer": "https://idp.example.com/realms/org", "client_id": "chat", "secret": "s"}
    for name, value in product.oidc_settings(
        {**product.OIDC_DEFAULTS, **spec, "name": "Keycloak"}
    ).items():
        setattr(settings, name, value)
    settings.CHAT_LOCAL_ACCOUNTS = False
    settings.AUTHENTICATION_BACKENDS = ["chat.accounts.oidc_backend.OidcBackend"]


def test_a_deactivated_users_key_is_refused_saying_why(alice):
    _, key = apikey_create(user=alice)
    assert accepted(key)
    alice.is_active = False
    alice.save()
    v1, api = over_both_apis(key)
    assert "deactivated" in v1["message"] and v1["message"] == api["message"]


def test_a_password_only_users_key_stops_with_local_accounts_off(alice, provider_only):
    """Nobody can sign in with a password any more, so a password-only account's key stops; an
    account the provider signs in keeps working."""
    _, key = apikey_create(user=alice)
    v1, api = over_both_apis(key)
    assert "password only" in v1["message"] and "Keycloak" in v1["message"]
    assert v1["message"] == api["message"] and "alice" not in v1["message"]
    grace = get_user_model().objects.create_user("grace")
    OidcIdentity.objects.create(
        user=grace, issuer="https://idp.example.com/realms/org", subject="g"
    )
    assert accepted(apikey_create(user=grace)[1])


def test_a_key_of_someone_not_seen_at_the_provider_for_too_long_is_refused(settings):
    """The provider is never asked about a key: a user removed there is known only by no longer
    signing in. CHAT_OIDC's key_idle_days (30 by default) bounds how long their key outlives
    that; 0 never refuses."""
    assert settings.CHAT_OIDC_KEY_IDLE_DAYS == 30
    grace = get_user_model().objects.create_user("grace")
    OidcIdentity.objects.create(
        user=grace, issuer="https://idp.example.com/realms/org", subject="g"
    )
    _, key = apikey_create(user=grace)
    OidcIdentity.objects.filter(user=grace).update(
        last_sign_in_at=timezone.now() - timedelta(days=29)
    )
    assert accepted(key)
    OidcIdentity.objects.filter(user=grace).update(
        last_sign_in_at=timezone.now() - timedelta(days=31)
    )
    v1, api = over_both_apis(key)
    assert "30 days" in v1["message"] and "sign in there again" in v1["message"]
    settings.CHAT_OIDC_KEY_IDLE_DAYS = 0
    assert accepted(key)


def test_a_key_made_to_expire_is_refused_once_it_has(alice):
    """The page offers never, 30, 90 or 365 days; the key works until then, and the page shows
    when it expires."""
    client = Client()
    client.force_login(alice)
    made = client.post("/account/api-keys/", {"create": "", "name": "ci", "expires": "30"})
    key = made.context["new_key"]
    row = ApiKey.objects.get(user=alice)
    assert timedelta(days=29) < row.expires_at - timezone.now() <= timedelta(days=30)
    assert f"{row.expires_at:%Y-%m-%d %H:%M}" in client.get("/account/api-keys/").content.decode()
    assert accepted(key)
    ApiKey.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    v1, api = over_both_apis(key)
    assert "expired" in v1["message"] and v1["message"] == api["message"]
    assert "expired" in client.get("/account/api-keys/").content.decode()
    listing = StringIO()
    call_command("apikey", "list", stdout=listing)
    assert "\texpired " in listing.getvalue()
    never = client.post("/account/api-keys/", {"create": "", "name": "forever"})
    assert accepted(never.context["new_key"])
    assert ApiKey.objects.get(name="forever").expires_at is None
    refused = client.post("/account/api-keys/", {"create": "", "expires": "7"})
    assert refused.status_code == 400 and ApiKey.objects.filter(user=alice).count() == 2


def test_staff_set_a_keys_expiry_in_the_admin(admin_client, alice):
    soon = (timezone.now() + timedelta(days=2)).replace(microsecond=0)
    admin_client.post(
        "/admin/chat/apikey/add/",
        {
            "user": alice.pk,
            "name": "ops",
            "expires_at_0": f"{soon:%Y-%m-%d}",
            "expires_at_1": f"{soon:%H:%M:%S}",
        },
    )
    assert ApiKey.objects.get(user=alice).expires_at == soon


def test_an_unknown_key_says_nothing_about_anyone(alice):
    _, key = apikey_create(user=alice)
    alice.is_active = False
    alice.save()
    v1, _ = over_both_apis("sk-" + "x" * 43)
    assert v1["message"] == "Incorrect or revoked API key provided"
