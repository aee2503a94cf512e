"""Sign-in with the OpenID Connect provider (CHAT_OIDC), through mozilla-django-oidc's views:
the start (state, nonce and PKCE kept in the session, the browser sent to the provider), the
callback (the code exchanged, the account signed in), and the provider's sign-out.

What they add: the failed sign-in throttle of local accounts (chat/infra/signin_throttle.py),
a readable page instead of a redirect or a 500 when sign-in fails or the provider cannot be
reached, and a visitor's conversations moving into the account, as at a password sign-in.
"""

from __future__ import annotations

import logging
import math
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib.auth.views import LogoutView
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.views.generic import View
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from ..infra import oidc_provider, signin_throttle
from ..infra.oidc_provider import OidcUnavailable
from .sign_in import adopt_conversations

log = logging.getLogger(__name__)


def provider_name() -> str | None:
    return settings.CHAT_OIDC["name"] if settings.CHAT_OIDC else None


def _refusal(request, message: str, status: int) -> HttpResponse:
    context = {"message": message, "provider": provider_name()}
    return render(request, "accounts/oidc_failed.html", context, status=status)


def _throttled(request, username: str) -> HttpResponse | None:
    """The sign-in throttle's answer, as the password form gives it, or None to go on."""
    wait = signin_throttle.wait_seconds(username, signin_throttle.client_address(request))
    if not wait:
        return None
    minutes = math.ceil(wait / 60)
    return _refusal(
        request,
        f"Too many failed sign-in attempts; try again in {minutes} "
        f"minute{'' if minutes == 1 else 's'}.",
        429,
    )


def _unavailable(request, exc: OidcUnavailable) -> HttpResponse:
    log.warning("OIDC provider unavailable: %s", exc)
    return _refusal(
        request,
        f"{provider_name()} cannot be reached to sign you in ({exc}). Try again in a moment.",
        503,
    )


class OidcSignInStart(OIDCAuthenticationRequestView):
    """`?next=` is kept for after the callback (the library checks it stays on this site)."""

    def __init__(self, **kwargs):
        View.__init__(self, **kwargs)  # the library's reads the endpoint from settings
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request):
        if not settings.CHAT_OIDC:
            raise Http404
        if refusal := _throttled(request, ""):
            return refusal
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc_provider.configuration()["authorization_endpoint"]
        except OidcUnavailable as exc:
            return _unavailable(request, exc)
        return super().get(request)


class OidcCallback(OIDCAuthenticationCallbackView):
    """A sign-in this browser started (its state is in the session) that fails (the provider's
    error, a code or token refused) counts as a failed sign-in for the client's address, and for
    the account when the provider named it. A callback with a state this session never made is
    refused without counting: no code is exchanged for it, and counting it would let any page a
    visitor opens (an <img> pointing here) lock their whole address out."""

    def get(self, request):
        if not settings.CHAT_OIDC:
            raise Http404
        if refusal := _throttled(request, ""):
            return refusal
        if request.GET.get("state") not in request.session.get("oidc_states", {}):
            return _refusal(
                request,
                "This sign-in was not started in this browser, or was already used; "
                "start again from the sign-in page.",
                403,
            )
        self.visitor_session = request.session.session_key  # login() gives it a new key
        try:
            return super().get(request)
        except (SuspiciousOperation, requests.HTTPError, jwt.PyJWTError) as exc:
            log.warning("OIDC sign-in refused: %s", exc)  # the provider or a check said no
            return self.login_failure()
        except requests.RequestException as exc:  # no answer: not the user's failure
            return _unavailable(request, OidcUnavailable(exc.__class__.__name__))
        except OidcUnavailable as exc:
            return _unavailable(request, exc)
        except Exception:  # an answer no check foresaw (a claim of the wrong type, say): no 500
            log.exception("OIDC sign-in failed")
            return self.login_failure()

    def _username(self) -> str:
        user = getattr(self, "user", None)
        return user.get_username() if user is not None else ""

    def login_failure(self):
        signin_throttle.record_failure(
            self._username(), signin_throttle.client_address(self.request)
        )
        return _refusal(
            self.request,
            f"Signing in with {provider_name()} did not work. Try again; if it keeps failing, "
            "ask your administrator.",
            403,
        )

    def login_success(self):
        username = self._username()
        if refusal := _throttled(self.request, username):
            return refusal
        response = super().login_success()
        signin_throttle.record_success(username)
        adopt_conversations(session_key=self.visitor_session, user=self.user)
        return response


def provider_sign_out_url(request) -> str | None:
    """Where the browser goes to end its session at the provider too, if it signed in there and
    the provider offers an end_session_endpoint; read before the local session (and the ID token
    kept in it) is gone."""
    id_token = request.session.get("oidc_id_token")
    if not settings.CHAT_OIDC or not id_token:
        return None
    try:
        endpoint = oidc_provider.configuration().get("end_session_endpoint")
    except OidcUnavailable as exc:
        log.warning("OIDC sign-out only here: %s", exc)  # the local session still ends
        return None
    if not endpoint:
        return None
    query = urlencode(
        {
            "id_token_hint": id_token,
            "client_id": settings.OIDC_RP_CLIENT_ID,
            "post_logout_redirect_uri": request.build_absolute_uri(
                resolve_url(settings.LOGOUT_REDIRECT_URL)
            ),
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


class SignOutView(LogoutView):
    """Django's sign-out (POST), then on to the provider's end_session_endpoint when the
    session came from it: signing out here ends the provider's session too."""

    def post(self, request, *args, **kwargs):
        provider_url = provider_sign_out_url(request)
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(provider_url) if provider_url else response
