"""The rate checks a prompt passes before it starts (per owner, and per visitor address), and a
resume's (per owner, and per socket)."""

from __future__ import annotations

from ..infra.ratelimit import (
    RateLimiter,
    address_limiter,
    connection_limiter,
    prompt_limiter,
    resume_limiter,
    span,
)
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


def socket_resume_limiter() -> RateLimiter:
    """The resumes one socket may send (CHAT_RATE_LIMITS' `resume_socket`)."""
    return connection_limiter("resume_socket")


def resume_rate_check(*, owner: Owner, socket: RateLimiter | None = None) -> None:
    """Count one resume against `socket`'s limit and the owner's; TurnError `rate_limited` when
    over either (then neither is counted). Each resume reads the database and Redis."""
    limits = [(resume_limiter, owner.rate_key)]
    if socket is not None:
        limits.append((socket, "socket"))
    for limiter, key in limits:
        wait = limiter.wait(key)
        if wait:
            where = " on this connection" if limiter is socket else ""
            raise TurnError(
                "rate_limited",
                f"too many resumes{where}: at most {limiter.limit} {span(limiter.window)}; "
                f"try again in {wait:.0f} s",
            )
    for limiter, key in limits:
        limiter.check(key)
