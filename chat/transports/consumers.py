"""The WebSocket endpoint: parse a frame, call the turn package, send events. Nothing else."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError

from .. import turns
from ..infra.ratelimit import client_address
from ..infra.runtime import runtime
from ..protocol import (
    CLOSE_SERVER_RESTARTING,
    CLOSE_TRY_LATER,
    CLOSE_UNAUTHORISED,
    SIGNED_OUT,
    Cancel,
    Ping,
    Prompt,
    ProtocolError,
    Resume,
    event_json,
    parse_frame,
)
from ..protocol.events import CancelAck, Error, Event, Pong
from ..stores.selectors import owner_of
from ..turns.signed_in import SignedIn, signed_in_close, signed_in_hold, signed_in_open

log = logging.getLogger(__name__)

# The sockets open in this process, so a stopping server can close each with a code the page knows.
open_sockets: set[ChatConsumer] = set()


async def sockets_close(timeout: float = 2.0) -> int:
    """Close every open socket with CLOSE_SERVER_RESTARTING and wait (up to `timeout`) until the
    clients have answered the close; how many were closed."""
    sockets = list(open_sockets)
    for consumer in sockets:
        try:
            await consumer.close(code=CLOSE_SERVER_RESTARTING)
        except Exception:  # one broken socket must not keep the others open
            log.exception("could not close a socket")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while open_sockets and loop.time() < deadline:
        await asyncio.sleep(0.02)
    return len(sockets)


class ChatConsumer(AsyncWebsocketConsumer):
    """Speaks the chat protocol at /ws/chat/; one running answer per connection."""

    # A turn lives in this process; cancels from other processes reach it through
    # the turn package's one listener per process, not through each socket. So the consumer does
    # not subscribe to the channel layer, and a Redis outage never drops a socket.
    channel_layer_alias = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.turns: dict[str, turns.Turn] = {}
        self.following: set[asyncio.Task] = set()  # answers of other processes, resumed here
        self.resumes = turns.socket_resume_limiter()
        self.signed_in: SignedIn | None = None  # a user's socket: re-checked before it acts

    async def __call__(self, scope, receive, send):
        """However the socket ends (a close, a crash in a handler, daphne cancelling it), its answer stops.

        A handler that raises ends the consumer without a `websocket.disconnect`, so
        `disconnect` alone would leave the answer generating for nobody.
        """
        try:
            await super().__call__(scope, receive, send)
        finally:
            open_sockets.discard(self)
            signed_in_close(self.signed_in)
            self._stop_turns()

    async def connect(self):
        """Accept, and make sure the visitor has a session their conversations belong to."""
        try:
            await self._owner()
        except DatabaseError as exc:
            # Say why before closing, so the page shows a reason and reconnects, not a bare failure.
            log.warning("closing a new socket: the database is unavailable (%s)", exc)
            await self.accept()
            await self.send_event(
                Error(None, "storage_failed", "the database is unavailable; reconnect in a moment")
            )
            await self.close(code=CLOSE_TRY_LATER)
            return
        await self.accept()
        if runtime.draining:  # a page reconnecting to a server that is stopping: try again
            await self.close(code=CLOSE_SERVER_RESTARTING)
            return
        open_sockets.add(self)
        if self.signed_in is not None:
            signed_in_hold(self.signed_in)
            turns.cancel_bus.ensure_listening()  # so that this process hears of sign-outs

    async def disconnect(self, code):
        """A closed tab stops its generation once nobody resumed it within the grace period
        (chat/turns/handle.py); the partial answer is still stored."""
        open_sockets.discard(self)
        signed_in_close(self.signed_in)
        self._stop_turns()

    async def _sign_in_ended(self, why: str) -> None:
        """The socket's sign-in ended: its answers stop now (no grace period), it is told why
        and closed."""
        if self not in open_sockets:  # closed meanwhile
            return
        open_sockets.discard(self)
        signed_in_close(self.signed_in)
        for turn in self.turns.values():
            if not turn.finished:
                turn.cancel(SIGNED_OUT)
        self._stop_turns()
        await self.send_event(Error(None, "unauthorised", why))
        await self.close(code=CLOSE_UNAUTHORISED)

    async def _may_act(self) -> bool:
        """A visitor may; a user's socket while its sign-in holds (else it is ended)."""
        return self.signed_in is None or await self.signed_in.check_or_end()

    def _stop_turns(self) -> None:
        """Detach from this socket's unfinished answers, once; each stops unless resumed in time."""
        stopping, self.turns = self.turns, {}
        for turn in stopping.values():
            turn.detach(self.send_event)
        for task in list(self.following):
            task.cancel()

    async def receive(self, text_data=None, bytes_data=None):
        """Dispatch on the frame's type; every bad frame gets an `error`, never a close."""
        try:
            command = parse_frame(text_data, max_prompt_chars=settings.CHAT_MAX_PROMPT_CHARS)
        except ProtocolError as exc:
            await self.send_event(Error(exc.request_id, exc.code, exc.message))
            return
        if isinstance(command, Ping):
            await self.send_event(Pong())
        elif not await self._may_act():
            return
        elif isinstance(command, Cancel):
            await self.cancel(command)
        elif isinstance(command, Prompt):
            await self.prompt(command)
        elif isinstance(command, Resume):
            await self.resume(command)

    async def prompt(self, prompt: Prompt):
        if prompt.request_id in self.turns:
            await self.send_event(
                Error(
                    prompt.request_id,
                    "duplicate_request_id",
                    "request_id was already used on this connection",
                )
            )
            return
        try:
            turn = await turns.admit(
                owner=self.owner,
                prompt=prompt,
                send=self.send_event,
                address=self._address(),
                running=next((t for t in self.turns.values() if not t.finished), None),
            )
        except turns.TurnError as exc:
            await self.send_event(exc.event(prompt.request_id))
            return
        self.turns[prompt.request_id] = turn

    async def resume(self, command: Resume):
        """The events of one of the owner's answers after `command.after`, then the live ones."""
        try:
            turn = await turns.turn_resume(
                owner=self.owner, resume=command, send=self.send_event, socket=self.resumes
            )
        except turns.TurnError as exc:
            await self.send_event(Error(None, exc.code, exc.message))
            return
        if isinstance(turn, turns.Following):  # generated elsewhere: followed until it ends
            self.following.add(turn.task)
            turn.task.add_done_callback(self.following.discard)
        elif turn is not None:  # this socket now holds it: Stop by request_id, and one at a time
            previous = self.turns.get(turn.request_id)
            if previous is not None and previous is not turn:
                previous.detach(self.send_event)
            self.turns[turn.request_id] = turn

    async def cancel(self, command: Cancel):
        """Stop this connection's request, or (with `message`) any of the owner's answers anywhere."""
        if command.message is not None:
            await self.cancel_message(command)
            return
        turn = self.turns.get(command.request_id)
        if turn is None:
            await self.send_event(
                Error(command.request_id, "unknown_request", "no such request on this connection")
            )
        elif not turn.finished:  # a Stop racing the last chunk is not an error
            turn.cancel()

    async def cancel_message(self, command: Cancel):
        try:
            result = await turns.turn_cancel(owner=self.owner, message_id=command.message)
        except turns.TurnError as exc:
            await self.send_event(Error(command.request_id, exc.code, exc.message))
            return
        await self.send_event(CancelAck(command.request_id, message=command.message, result=result))

    def _address(self) -> str | None:
        peer = (self.scope.get("client") or [None])[0]
        forwarded = dict(self.scope.get("headers", [])).get(b"x-forwarded-for", b"")
        return client_address(peer, forwarded.decode("latin1"))

    async def send_event(self, event: Event):
        await self.send(text_data=event_json(event))

    @database_sync_to_async
    def _owner(self) -> None:
        session = self.scope["session"]
        self.owner = owner_of(self.scope.get("user"), session)
        self.signed_in = signed_in_open(self.owner, session, self._sign_in_ended)
