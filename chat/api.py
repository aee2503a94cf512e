"""The chat over plain HTTP, for clients without WebSockets (docs/protocol.md).

- `POST /api/chat/stream` answers `text/event-stream`: one `data: <json>` line per
  protocol event (accepted, queued, chunk, buffering, retract, done, error).
- `POST /api/chat` answers the final `done` event as JSON (or the `error` event
  with a fitting HTTP status).
- `POST /api/chat/cancel` with `{"message": <id>}` stops one of the caller's answers,
  wherever it runs.

The body of the first two is a `prompt` frame; `type` and `request_id` may be left
out. A prompt refused before it starts (bad body, rate limit, unknown conversation,
model still loading) is an HTTP error whose JSON body is the `error` event, for
both. The caller is the session (or signed-in user), as on the socket, and CSRF
protection is on: `GET /api/csrf` sets the session and `csrftoken` cookies and
returns the token, which goes back in the `X-CSRFToken` header with the cookies.
Closing the connection cancels the turn, like closing the tab.
"""

from __future__ import annotations

import asyncio
import json
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.decorators.http import require_GET, require_POST

from . import inputs, services
from .protocol import (
    MAX_FRAME_BYTES,
    ProtocolError,
    cancel_ack_event,
    error_event,
    parse_http_cancel,
    parse_http_prompt,
)
from .ratelimit import client_address
from .selectors import owner_of_request

log = logging.getLogger(__name__)

# A comment line now and then keeps proxies from closing a stream that waits in the queue.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE = ": keepalive\n\n"  # an SSE comment line

# HTTP status of a refused turn, by error code; anything else is a bad request.
STATUS_FOR_CODE = {
    "frame_too_large": 413,
    "unknown_conversation": 404,
    "unknown_request": 404,
    "rate_limited": 429,
    "model_loading": 503,
    "server_restarting": 503,
    "queue_full": 503,
    "cancel_unavailable": 503,
    "model_error": 500,
    "storage_failed": 500,
}


def _error_response(code: str, message: str, request_id: str | None = None) -> JsonResponse:
    response = JsonResponse(
        error_event(code, message, request_id), status=STATUS_FOR_CODE.get(code, 400)
    )
    if code == "rate_limited":
        response["Retry-After"] = "60"
    elif code == "server_restarting":
        response["Retry-After"] = "5"
    return response


def _body(request) -> bytes:
    """The request body (chat/inputs.py), or ProtocolError `frame_too_large` past a frame's size."""
    try:
        return inputs.body_read(request, limit=MAX_FRAME_BYTES)
    except inputs.InputError:
        raise ProtocolError(
            "frame_too_large", f"the body is over {MAX_FRAME_BYTES} bytes, a prompt frame's limit"
        ) from None


class TurnFeed:
    """Collects a turn's events in a queue for a response to hand on; ends when the turn does."""

    END = None

    def __init__(self):
        self.events: asyncio.Queue = asyncio.Queue()
        self.turn: services.Turn | None = None

    async def send(self, event: dict) -> None:
        await self.events.put(event)

    async def start(self, request) -> JsonResponse | None:
        """Parse, rate-check and start the turn; an error response if it was refused."""
        prompt = None
        try:
            prompt = parse_http_prompt(
                _body(request), max_prompt_chars=settings.CHAT_MAX_PROMPT_CHARS
            )
            owner = await sync_to_async(owner_of_request)(request)
            services.turn_rate_check(
                owner=owner,
                address=client_address(
                    request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR")
                ),
            )
            self.turn = await services.turn_start(owner=owner, prompt=prompt, send=self.send)
        except ProtocolError as exc:
            return _error_response(exc.code, exc.message, exc.request_id)
        except services.TurnError as exc:
            return _error_response(exc.code, exc.message, prompt.request_id)
        self.follow(self.turn)
        return None

    def follow(self, turn: services.Turn) -> None:
        """Queue END after the last event of `turn`, started with this feed's `send`."""
        self.turn = turn
        if turn.task is None:  # served from the cache: every event is already queued
            self.events.put_nowait(self.END)
        else:
            turn.task.add_done_callback(lambda _: self.events.put_nowait(self.END))

    async def until_end(self):
        """The turn's events as they come, and KEEPALIVE after every quiet KEEPALIVE_SECONDS
        (a comment line now and then keeps proxies from closing a stream waiting in the queue)."""
        while True:
            try:
                event = await asyncio.wait_for(self.events.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield KEEPALIVE
                continue
            if event is self.END:
                return
            yield event

    def abandon(self) -> None:
        """The client went away: stop the generation; the partial answer is still stored."""
        if self.turn is not None:
            self.turn.detach()
            if not self.turn.finished:
                log.info("HTTP client of %s went away; cancelling", self.turn.request_id)
                self.turn.cancel()


@require_POST
async def chat_stream(request):
    """The turn's events as server-sent events, as they happen."""
    feed = TurnFeed()
    refused = await feed.start(request)
    if refused is not None:
        return refused

    async def stream():
        try:
            async for event in feed.until_end():
                yield (
                    event
                    if event is KEEPALIVE
                    else f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
                )
        finally:
            # Django cancels this generator when the client disconnects; a finished turn ignores it.
            feed.abandon()

    response = StreamingHttpResponse(stream(), content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


@require_POST
async def chat(request):
    """The turn's final `done` event as JSON, or its `error` with a fitting status."""
    feed = TurnFeed()
    refused = await feed.start(request)
    if refused is not None:
        return refused
    done = error = None
    try:
        while (event := await feed.events.get()) is not feed.END:
            if event["type"] == "done":
                done = event
            elif event["type"] == "error" and event["code"] != "storage_failed":
                error = event
    finally:
        feed.abandon()  # a no-op unless the client left before the end
    if done is not None:
        return JsonResponse(done)
    error = error or error_event(
        "model_error", "the answer ended without a result", feed.turn.request_id
    )
    return _error_response(error["code"], error["message"], error["request_id"])


@require_POST
async def cancel(request):
    """Stop one of the caller's answers, in this process or another; says what happened."""
    try:
        message_id = parse_http_cancel(_body(request))
        owner = await sync_to_async(owner_of_request)(request)
        result = await services.turn_cancel(owner=owner, message_id=message_id)
    except (ProtocolError, services.TurnError) as exc:
        return _error_response(exc.code, exc.message)
    return JsonResponse(cancel_ack_event(None, message=message_id, result=result))


@require_GET
def csrf(request):
    """Sets the session and csrftoken cookies; returns the token for the X-CSRFToken header."""
    owner_of_request(request)  # a client without a session gets one, so its answers stay its own
    return JsonResponse({"csrf_token": get_token(request)})


def csrf_failure(request, reason: str = ""):
    """CSRF_FAILURE_VIEW: an `error` event for API clients, Django's page for everything else."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            error_event(
                "csrf_failed",
                f"CSRF check failed ({reason}); GET /api/csrf and send its "
                "token in an X-CSRFToken header with the cookies",
            ),
            status=403,
        )
    return django_csrf_failure(request, reason)
