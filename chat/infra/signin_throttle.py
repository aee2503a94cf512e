"""Failed sign-ins counted per account and per client address (chat/infra/ratelimit.py).

Used by the page's sign-in form, /admin/login/ and every other password check. Past either limit
every attempt, even with the right password, is refused until the oldest failure leaves the
window; a refused attempt counts nothing, and a right password clears the account's count (not
the address's). The address is the one the prompt limits use (CHAT_TRUSTED_PROXIES, IPv6 by /64).
"""

from __future__ import annotations

import math

from django.core.exceptions import ValidationError

from . import audit, ratelimit
from .ratelimit import signin_account_limiter, signin_address_limiter


def _keys(username: str, address: str) -> list[tuple[ratelimit.SharedRateLimiter, str]]:
    keys = [(signin_address_limiter, address)]
    if username:
        keys.append((signin_account_limiter, username.casefold()))
    return keys


def wait_seconds(username: str, address: str) -> float:
    """0 if an attempt is allowed now, else the seconds until it will be."""
    return max(limiter.wait(key) for limiter, key in _keys(username, address))


def record_failure(username: str, address: str) -> None:
    """Count a failed attempt; the failure that trips a limit is recorded in the audit trail.

    Only attempts allowed through are counted (a refused one counts nothing), so a limit that
    refuses now was tripped by this failure: one record names every limit it tripped.
    """
    tripped = []
    for limiter, key in _keys(username, address):
        limiter.check(key)
        if limiter.wait(key):
            tripped.append(limiter.name)
    if tripped:
        audit.audit_signin_throttled(username=username, address=address, limits=tripped)


def record_success(username: str) -> None:
    """A right password clears the account's count (not the address's)."""
    signin_account_limiter.reset(username.casefold())


def client_address(request) -> str:
    meta = request.META if request is not None else {}
    address = ratelimit.client_address(meta.get("REMOTE_ADDR"), meta.get("HTTP_X_FORWARDED_FOR"))
    return address or "unknown"


class ThrottledSignInMixin:
    """For AuthenticationForm and its admin subclass: refuse while throttled, count failures."""

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request)
        wait = wait_seconds(username, address)
        if wait:
            minutes = math.ceil(wait / 60)
            raise ValidationError(
                "Too many failed sign-in attempts; try again in %(n)d minute%(s)s.",
                code="throttled",
                params={"n": minutes, "s": "" if minutes == 1 else "s"},
            )
        try:
            cleaned = super().clean()
        except ValidationError:
            record_failure(username, address)
            raise
        record_success(username)
        return cleaned
