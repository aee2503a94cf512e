"""The authentication backend for sign-in with the OpenID Connect provider: mozilla-django-oidc's
code flow (the code exchanged for tokens, the ID token's signature checked against the
provider's JWKS, its nonce against the session's), with what the library leaves out added here.

Written by hand, and why:
- Endpoints come from the provider's discovery document (chat/infra/oidc_provider.py) at sign-in,
  not from settings: the library reads them in `__init__`, which Django runs for every request of
  a signed-in user, and the provider must not be asked then.
- The ID token's audience and issuer are checked (the library decodes with `verify_aud` off and
  no issuer), and the userinfo must describe the ID token's subject (OpenID Connect Core 5.3.4).
- The account is found by (issuer, subject), not by e-mail address as the library does
  (chat/stores/oidc_accounts.py).
- The signing key: the library requires a `kid` in the token and in every key (a KeyError, so
  a 500, from a provider that signs without one, which OpenID Connect Core 10.1 allows when its
  JWKS holds a single key).
"""

from __future__ import annotations

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from ..infra import oidc_provider
from ..stores.oidc_accounts import account_for

# Claims an ID token must carry (OpenID Connect Core 2).
REQUIRED_CLAIMS = ["iss", "sub", "aud", "exp", "iat"]
# The JWK key type each family of JWS algorithms signs with (RFC 7518 3.1).
KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}


def signing_key(jwks: dict, header: dict) -> dict:
    """The JWKS key that signed a token with this header: the one of its `kid`; without a kid,
    the only signing key of its algorithm. None or several: SuspiciousOperation."""
    algorithm = header.get("alg")
    keys = [
        key
        for key in jwks.get("keys", [])
        if isinstance(key, dict)
        and key.get("use", "sig") == "sig"
        and key.get("alg", algorithm) == algorithm
        and key.get("kty") == KEY_TYPES.get(str(algorithm)[:2])
    ]
    if "kid" in header:
        keys = [key for key in keys if key.get("kid") == header["kid"]]
    if len(keys) != 1:
        raise SuspiciousOperation(
            f"{len(keys)} keys in the provider's JWKS for an ID token with header {header}"
        )
    return keys[0]


class OidcBackend(OIDCAuthenticationBackend):
    def __init__(self, *args, **kwargs):
        # No network and no provider settings here: see the module's docstring.
        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request, nonce=None, code_verifier=None, **credentials):
        """Only the provider's callback (which passes the nonce it kept) is ours; a password
        sign-in, or a request that merely carries `code` and `state`, is not."""
        if request is None or nonce is None or credentials or not settings.CHAT_OIDC:
            return None
        provider = oidc_provider.configuration()
        self.OIDC_OP_TOKEN_ENDPOINT = provider["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = provider["userinfo_endpoint"]
        self.OIDC_OP_JWKS_ENDPOINT = provider["jwks_uri"]
        return super().authenticate(request, nonce=nonce, code_verifier=code_verifier)

    def retrieve_matching_jwk(self, token):
        response = requests.get(self.OIDC_OP_JWKS_ENDPOINT, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from exc
        return jwt.PyJWK(signing_key(response.json(), header))

    def get_payload_data(self, token, key):
        """The ID token's claims once its signature, algorithm, audience, issuer and lifetime
        check out; else SuspiciousOperation, which fails the sign-in."""
        try:
            algorithm = jwt.get_unverified_header(token).get("alg")
            if algorithm != self.OIDC_RP_SIGN_ALGO:
                raise SuspiciousOperation(f"ID token signed with {algorithm!r}")
            return jwt.decode(
                token,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.CHAT_OIDC["issuer"],
                options={"require": REQUIRED_CLAIMS},
                leeway=30,  # the two clocks may differ a little
            )
        except jwt.PyJWTError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from exc

    def get_or_create_user(self, access_token, id_token, payload):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if str(userinfo.get("sub")) != str(payload["sub"]):
            raise SuspiciousOperation("the userinfo describes another subject than the ID token")
        self.claims = {**payload, **userinfo}  # the callback names the account on failure
        return account_for(
            self.claims, issuer=settings.CHAT_OIDC["issuer"], mapping=settings.CHAT_OIDC
        )

    # A session's user, as for a local account: an inactive one is signed out.
    get_user = ModelBackend.get_user
