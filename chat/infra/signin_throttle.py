"""Failed sign-ins counted per account and per client address, in Django's cache (Redis).

The window counts here (`window_wait`, `window_count`) also count sign-ups per address
(chat/infra/signup_throttle.py). Used by the page's sign-in form and by /admin/login/ alike. A count lives for the window
that began with its first failure; past the limit every attempt, even with the right
password, is refused until the window ends. If the cache is unreachable the attempt is let
through to the password check (logged): Django still checks the password, and a Redis
outage must not lock every user out.
"""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError

log = logging.getLogger(__name__)


def _keys(username: str, address: str) -> list[tuple[str, int]]:
    keys = [(f"signin:addr:{address}", settings.CHAT_SIGNIN_FAILURES_PER_ADDRESS)]
    if username:
        keys.append(
            (f"signin:user:{username.casefold()}", settings.CHAT_SIGNIN_FAILURES_PER_ACCOUNT)
        )
    return keys


def window_wait(key: str, limit: int, window: float) -> float:
    """0 if `key` has counted fewer than `limit` (0: no limit) in its window, else the seconds
    until that window ends. Raises what the cache raises; callers decide to fail open."""
    if limit > 0 and cache.get(f"{key}:n", 0) >= limit:
        now = time.time()
        return max(1.0, window - (now - cache.get(f"{key}:t", now)))
    return 0.0


def window_count(key: str, window: float) -> None:
    """Count one for `key`; its window begins with its first count."""
    cache.add(f"{key}:t", time.time(), window)
    cache.add(f"{key}:n", 0, window)
    cache.incr(f"{key}:n")


def wait_seconds(username: str, address: str) -> float:
    """0 if an attempt is allowed now, else the seconds until it will be."""
    window = settings.CHAT_SIGNIN_WINDOW_MINUTES * 60
    try:
        for key, limit in _keys(username, address):
            if wait := window_wait(key, limit, window):
                return wait
    except Exception as exc:  # Redis down: fail open, the password is still checked
        log.warning("sign-in throttle unavailable: %s", exc)
    return 0.0


def record_failure(username: str, address: str) -> None:
    window = settings.CHAT_SIGNIN_WINDOW_MINUTES * 60
    try:
        for key, _limit in _keys(username, address):
            window_count(key, window)
    except Exception as exc:
        log.warning("sign-in throttle unavailable: %s", exc)


def record_success(username: str) -> None:
    """A right password clears the account's count (not the address's)."""
    try:
        key = f"signin:user:{username.casefold()}"
        cache.delete_many([f"{key}:n", f"{key}:t"])
    except Exception as exc:
        log.warning("sign-in throttle unavailable: %s", exc)


def client_address(request) -> str:
    return (request.META.get("REMOTE_ADDR") if request is not None else None) or "unknown"


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
