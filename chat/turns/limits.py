"""The rate checks a prompt passes before it starts: per owner, and per visitor address."""

from __future__ import annotations

from ..infra.ratelimit import address_limiter, prompt_limiter
from ..infra.runtime import runtime
from ..protocol import SERVER_RESTARTING, server_restarting_error
from ..stores.selectors import Owner
from .refusals import TurnError


def turn_rate_check(*, owner: Owner, address: str | None = None) -> None:
    """Count one prompt against the owner's limit, and a visitor's address's;
    TurnError `rate_limited` when over either (then neither is counted), and
    `server_restarting` while the process drains (then nothing is counted)."""
    if runtime.draining:
        raise TurnError(SERVER_RESTARTING, server_restarting_error().message)
    limits = [(prompt_limiter, owner.rate_key)]
    if owner.user_id is None and address is not None:
        limits.append((address_limiter, f"address:{address}"))
    for limiter, key in limits:
        wait = limiter.wait(key)
        if wait:
            raise TurnError(
                "rate_limited",
                f"too many prompts{' from this address' if limiter is address_limiter else ''}: "
                f"at most {limiter.limit} {limiter.per}; try again in {wait:.0f} s",
            )
    for limiter, key in limits:
        limiter.check(key)
