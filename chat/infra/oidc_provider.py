"""The OpenID Connect provider's configuration (CHAT_OIDC's issuer), discovered from its
`/.well-known/openid-configuration` at the first sign-in and kept for an hour.

At first use rather than at start-up: a provider down while the server starts must not stop the
chat, whose local accounts and visitors need no provider. A document that cannot be read is an
`OidcUnavailable` whose message names the issuer and what went wrong, for the sign-in page.
"""

from __future__ import annotations

import threading
import time

import requests
from django.conf import settings

# Endpoints that may move (a provider upgraded, a realm renamed) are read again after this long.
DISCOVERY_TTL_S = 3600
REQUIRED = ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")

_lock = threading.Lock()
_documents: dict[str, tuple[float, dict]] = {}  # issuer -> (monotonic time read, document)


class OidcUnavailable(Exception):
    """The provider's configuration could not be read or is not usable; the message says why."""


def configuration() -> dict:
    """The discovery document of settings.CHAT_OIDC's issuer, fetched at most once an hour."""
    issuer = settings.CHAT_OIDC["issuer"]
    with _lock:
        cached = _documents.get(issuer)
        if cached and time.monotonic() - cached[0] < DISCOVERY_TTL_S:
            return cached[1]
    document = _fetch(issuer)
    with _lock:
        _documents[issuer] = (time.monotonic(), document)
    return document


def forget() -> None:
    """Drop every document read (the tests' providers come and go)."""
    with _lock:
        _documents.clear()


def _fetch(issuer: str) -> dict:
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        document = response.json()
    except requests.RequestException as exc:
        raise OidcUnavailable(f"cannot read {url}: {exc.__class__.__name__}") from exc
    except ValueError as exc:
        raise OidcUnavailable(f"{url} is not JSON") from exc
    if not isinstance(document, dict):
        raise OidcUnavailable(f"{url} is not a JSON object")
    # OpenID Connect Discovery 4.3: the document must name the issuer it was fetched for, or
    # tokens would be checked against another issuer than the one configured.
    if str(document.get("issuer", "")).rstrip("/") != issuer:
        raise OidcUnavailable(f"{url} names issuer {document.get('issuer')!r}, not {issuer!r}")
    missing = [key for key in REQUIRED if not document.get(key)]
    if missing:
        raise OidcUnavailable(f"{url} gives no {', '.join(missing)}")
    algorithms = document.get("id_token_signing_alg_values_supported") or []
    if settings.OIDC_RP_SIGN_ALGO not in algorithms:
        raise OidcUnavailable(
            f"{issuer} does not sign ID tokens with {settings.OIDC_RP_SIGN_ALGO} "
            f"(it offers {', '.join(algorithms) or 'nothing'})"
        )
    return document
