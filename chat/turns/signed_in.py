"""The signed-in sockets open in this process, held to their sign-in for as long as they stay open.

A socket learns who it speaks for once, when it connects. So each signed-in socket is checked
again (chat/stores/access.py) at every frame that acts on answers, and ended at once, without
waiting for one, when its session signs out or its account is deactivated, deleted or given a new
password: those publish a notice on the cancel bus (chat/turns/running.py), and every process
checks its own sockets of that account. The sockets stay off the channel layer themselves, as
the consumer's design wants: with Redis down, a socket is still refused at its next prompt.

The same notice checks the account's API-key answers running here: a key that no longer works
(chat/stores/apikeys.py) stops its answers too, as a revoked one does.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from ..stores import access
from ..stores.selectors import Owner
from .cancel_bus import Cancellable

log = logging.getLogger(__name__)

# How a transport ends its socket: the `error` with this sentence, its answers stopped, closed.
End = Callable[[str], Awaitable[None]]


@dataclass(eq=False)
class SignedIn:
    """A socket's sign-in: its owner (a user) and the session's auth hash when it connected."""

    owner: Owner
    auth_hash: str
    end: End

    async def refusal(self) -> str | None:
        """Why this socket no longer speaks for its user; None while it does."""
        return await sync_to_async(access.session_refusal)(
            user_id=self.owner.user_id, session_key=self.owner.session_key, auth_hash=self.auth_hash
        )

    async def check_or_end(self) -> bool:
        """True while the sign-in holds; else the socket is ended and False."""
        refusal = await self.refusal()
        if refusal is None:
            return True
        log.info("ending a socket of user %s: %s", self.owner.user_id, refusal)
        await self.end(refusal)
        return False


# By owner digest: the notices name an account by it.
_open: dict[str, set[SignedIn]] = {}
# Checks started by a notice, kept until done so none is collected mid-way.
_checks: set[asyncio.Task] = set()


def signed_in_open(owner: Owner, session, end: End) -> SignedIn | None:
    """The sign-in of a socket of `owner` on `session` (sync: reads the session); None for a
    visitor, who has nothing to lose."""
    if owner.user_id is None:
        return None
    return SignedIn(owner, access.session_auth_hash(session), end)


def signed_in_hold(held: SignedIn) -> None:
    """Register an open socket's sign-in (on the loop), until `signed_in_close`, so the notices
    reach it."""
    _open.setdefault(held.owner.digest, set()).add(held)


def signed_in_close(held: SignedIn | None) -> None:
    if held is None:
        return
    sockets = _open.get(held.owner.digest)
    if sockets is not None:
        sockets.discard(held)
        if not sockets:
            del _open[held.owner.digest]


def _soon(work: Coroutine[Any, Any, object]) -> None:
    # A fresh context: the check may outlive the request whose save started it.
    task = asyncio.get_running_loop().create_task(work, context=contextvars.Context())
    _checks.add(task)
    task.add_done_callback(_checks.discard)


def session_ended(owner: str, session: str) -> None:
    """A session signed out (on the loop): end its sockets here, without asking the database,
    which may not have dropped the session yet."""
    for held in list(_open.get(owner, ())):
        if hmac.compare_digest(held.owner.session_digest, session):
            _soon(held.end("you signed out; sign in again"))


def account_changed(owner: str, unfinished: list[Cancellable], reason: str) -> None:
    """An account was saved or deleted (on the loop): check its sockets here again, and stop its
    API-key answers here, with `reason`, if its keys no longer work."""
    for held in list(_open.get(owner, ())):
        _soon(held.check_or_end())
    keyed = [
        turn
        for turn in unfinished
        if turn.api_key_id is not None and hmac.compare_digest(turn.owner.digest, owner)
    ]
    if keyed:
        _soon(_keys_check(keyed, reason))


async def _keys_check(keyed: list, reason: str) -> None:
    user_id = keyed[0].owner.user_id
    refusal = await sync_to_async(access.user_refusal)(user_id)
    if refusal is None:
        return
    log.info("stopping %d API-key answer(s) of user %s: %s", len(keyed), user_id, refusal)
    for turn in keyed:
        turn.cancel(reason)
