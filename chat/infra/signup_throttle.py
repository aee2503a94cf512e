"""Accounts made per client address (chat/infra/ratelimit.py: CHAT_RATE_LIMITS signup_address).

Without it one address could make an account a second, and each account has its own prompt
limit. Counted when an account is made; past the limit the form is refused (429) until the
oldest sign-up leaves the window. The address is the one the prompt limits use.
"""

from __future__ import annotations

from .ratelimit import client_address, signup_limiter


def _key(request) -> str:
    address = client_address(
        request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR")
    )
    return address or "unknown"


def signup_wait(request) -> float:
    """0 if this address may make an account now, else the seconds until it may."""
    return signup_limiter.wait(_key(request))


def signup_count(request) -> None:
    """An account was made from this address."""
    signup_limiter.check(_key(request))
