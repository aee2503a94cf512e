"""API keys: stored hashed, made and revoked by the command, the account page and the admin."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from chat.models import ApiKey
from chat.stores.apikeys import apikey_authenticate, apikey_create

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
