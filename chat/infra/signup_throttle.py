"""Sign-ups counted per client address, in the sign-in throttle's Redis-shared windows.

Without it one address could make an account a second, and each account has its own
prompt limit. CHAT_SIGNUPS_PER_ADDRESS accounts (5 by default) in CHAT_SIGNUP_WINDOW_MINUTES
(60), counted when an account is made; past that the form is refused (429) until the window
ends. The address is the one the prompt limits use (chat/infra/ratelimit.py: CHAT_TRUSTED_PROXIES,
IPv6 by /64). If Redis is unreachable sign-up is let through (logged), as sign-in is.
"""

from __future__ import annotations

import logging

from django.conf import settings

from .ratelimit import client_address
from .signin_throttle import window_count, window_wait

log = logging.getLogger(__name__)


def _key(request) -> str:
    address = client_address(
        request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR")
    )
    return f"signup:addr:{address or 'unknown'}"


def signup_wait(request) -> float:
    """0 if this address may make an account now, else the seconds until it may."""
    try:
        return window_wait(
            _key(request),
            settings.CHAT_SIGNUPS_PER_ADDRESS,
            settings.CHAT_SIGNUP_WINDOW_MINUTES * 60,
        )
    except Exception as exc:  # Redis down: fail open
        log.warning("sign-up throttle unavailable: %s", exc)
        return 0.0


def signup_count(request) -> None:
    """An account was made from this address."""
    try:
        window_count(_key(request), settings.CHAT_SIGNUP_WINDOW_MINUTES * 60)
    except Exception as exc:
        log.warning("sign-up throttle unavailable: %s", exc)
