"""Sign-in with an OpenID Connect provider, the parts without a provider: CHAT_OIDC's parsing,
the groups claim, and the ID token checks the library leaves out (audience, issuer, lifetime,
algorithm), on tokens signed here with a key made here. The protocol itself is tested against a
real provider in tests/test_oidc.py."""

import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation

from chat.accounts.oidc_backend import OidcBackend, signing_key
from chat.stores.oidc_accounts import groups_of
from project import settings as product

pytestmark = pytest.mark.unit

ISSUER = "https://idp.example.com/realms/staff"


def parsed(**keys: str) -> dict:
    return product.oidc_settings({**product.OIDC_DEFAULTS, **keys})


def test_chat_oidc_gives_the_librarys_settings_and_the_mapping():
    """Lists inside a value are space-separated; a percent-encoded secret is decoded; the name
    defaults to the issuer's host."""
    spec = parsed(
        issuer=ISSUER + "/",
        client_id="chat",
        secret="a%2Cb",
        scopes="openid email profile groups",
        groups_claim="groups",
        staff_groups="chat-staff ops",
        superuser_groups="chat-admins",
    )
    assert spec["OIDC_RP_CLIENT_ID"] == "chat" and spec["OIDC_RP_CLIENT_SECRET"] == "a,b"
    assert spec["OIDC_RP_SCOPES"] == "openid email profile groups"
    mapping = spec["CHAT_OIDC"]
    assert mapping["issuer"] == ISSUER and mapping["name"] == "idp.example.com"
    assert mapping["staff_groups"] == {"chat-staff", "ops"}
    assert mapping["origin"] == "https://idp.example.com"
    assert parsed()["CHAT_OIDC"] is None  # no issuer: off


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"issuer": "idp.example.com", "client_id": "c", "secret": "s"}, "https:// URL"),
        ({"issuer": ISSUER}, "needs client_id=... and secret=..."),
        ({"issuer": ISSUER, "client_id": "c", "secret": "s", "scopes": "email"}, "openid"),
    ],
)
def test_a_malformed_chat_oidc_stops_start_up(keys, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parsed(**keys)


def test_the_groups_claim_as_a_list_a_string_or_keycloaks_full_paths():
    assert groups_of({"groups": ["/chat-staff", "ops"]}, "groups") == {"chat-staff", "ops"}
    assert groups_of({"roles": "chat-admins"}, "roles") == {"chat-admins"}
    assert groups_of({}, "groups") == set() and groups_of({"groups": 3}, "groups") == set()


@pytest.fixture
def key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def oidc_backend(settings):
    settings.CHAT_OIDC = parsed(issuer=ISSUER, client_id="chat", secret="s")["CHAT_OIDC"]
    settings.OIDC_RP_CLIENT_ID = "chat"
    return OidcBackend()


def token(key, **claims) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "sub": "u1", "aud": "chat", "iat": now, "exp": now + 300, **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm="RS256")


def test_an_id_token_for_this_client_from_this_issuer_passes(oidc_backend, key):
    assert oidc_backend.get_payload_data(token(key), key.public_key())["sub"] == "u1"


@pytest.mark.parametrize(
    "claims",
    [
        {"aud": "another-client"},  # meant for another client of the same provider
        {"iss": "https://idp.example.com/realms/other"},  # another realm's token
        {"exp": int(time.time()) - 3600},  # expired
        {"exp": None},  # no lifetime at all
    ],
)
def test_an_id_token_for_another_client_issuer_or_time_is_refused(oidc_backend, key, claims):
    with pytest.raises(SuspiciousOperation):
        oidc_backend.get_payload_data(token(key, **claims), key.public_key())


def test_an_id_token_signed_with_another_key_or_algorithm_is_refused(oidc_backend, key):
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(SuspiciousOperation):
        oidc_backend.get_payload_data(token(other), key.public_key())
    hmac = jwt.encode({"iss": ISSUER, "sub": "u1", "aud": "chat"}, "s" * 32, algorithm="HS256")
    with pytest.raises(SuspiciousOperation, match="HS256"):
        oidc_backend.get_payload_data(hmac, key.public_key())


def test_a_password_sign_in_never_reaches_the_provider(oidc_backend, rf):
    """The backend answers only the callback (which passes the nonce it kept): a password
    attempt, even on a URL carrying code and state, is not its business."""
    request = rf.get("/accounts/login/?code=x&state=y")
    assert oidc_backend.authenticate(request, username="ada", password="pw") is None


def public_jwk(key, **fields) -> dict:
    return {**jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True), **fields}


def test_a_token_without_kid_is_checked_against_the_one_key_of_its_algorithm(key):
    """OpenID Connect Core 10.1: no kid is fine while the JWKS holds one signing key of the
    token's algorithm; two such keys, or none, refuse the token rather than guess."""
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    header = {"alg": "RS256"}
    one = {"keys": [public_jwk(key), public_jwk(other, use="enc"), {"kty": "EC", "crv": "P-256"}]}
    assert signing_key(one, header)["n"] == public_jwk(key)["n"]
    for jwks in ({"keys": [public_jwk(key), public_jwk(other)]}, {"keys": []}, {}):
        with pytest.raises(SuspiciousOperation):
            signing_key(jwks, header)
    two = {"keys": [public_jwk(key, kid="a"), public_jwk(other, kid="b")]}
    assert signing_key(two, {"alg": "RS256", "kid": "b"})["kid"] == "b"
    with pytest.raises(SuspiciousOperation):
        signing_key(two, {"alg": "RS256", "kid": "c"})
    with pytest.raises(SuspiciousOperation):  # a key marked for another algorithm
        signing_key({"keys": [public_jwk(key, alg="RS512")]}, header)


@pytest.mark.django_db
def test_a_userinfo_about_another_subject_is_refused(oidc_backend, monkeypatch):
    """OpenID Connect Core 5.3.4: the userinfo must describe the ID token's subject, or its
    claims (name, e-mail address, groups) would be another person's."""
    from django.contrib.auth.models import User

    payload = {"iss": ISSUER, "sub": "u1", "aud": "chat"}
    answers = {"sub": "u2", "email": "mallory@example.com", "preferred_username": "mallory"}
    monkeypatch.setattr(oidc_backend, "get_userinfo", lambda *args: answers)
    with pytest.raises(SuspiciousOperation, match="another subject"):
        oidc_backend.get_or_create_user("access", "id", payload)
    assert not User.objects.exists()
    answers["sub"] = "u1"  # the same answer about the right subject makes the account
    assert oidc_backend.get_or_create_user("access", "id", payload).username == "mallory"
