"""Sign-in with an OpenID Connect provider, the parts without a provider: CHAT_OIDC's parsing,
the groups claim, and the ID token checks the library leaves out (audience, issuer, lifetime,
algorithm), on tokens signed here with a key made here. The protocol itself is tested against a
real provider in tests/test_oidc.py."""

import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation

from chat.stores.oidc_accounts import groups_of
from chat.transports.oidc_backend import OidcBackend
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
