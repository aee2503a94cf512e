"""The chat over plain HTTP, for clients without WebSockets (docs/protocol.md).

- `POST /api/chat/stream` answers `text/event-stream`: one `data: <json>` line per
  protocol event (accepted, queued, chunk, buffering, retract, done, error), each with an
  `id: <message>:<seq>` line. Sent again with that id as `Last-Event-ID`, it resumes the
  answer after that event instead of starting a prompt (SSE's own reconnection).
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
Closing the stream leaves the answer `CHAT_TIMEOUTS` `resume` seconds to be resumed, like closing the tab;
`POST /api/chat` stops it at once.
"""

from __future__ import annotations

import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse
from django.middleware.csrf import get_token
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.decorators.http import require_GET, require_POST

from .. import turns
from ..infra.ratelimit import client_address
from ..protocol import (
    MAX_FRAME_BYTES,
    ProtocolError,
    error_fields,
    event_id,
    event_json,
    events,
    inputs,
    parse_http_cancel,
    parse_http_prompt,
    parse_last_event_id,
)
from ..protocol.errors import error_code
from ..stores.selectors import owner_of_request
from .feed import KEEPALIVE, TurnFeed
from .sse import sse_response

log = logging.getLogger(__name__)


def _error_response(
    code: str, message: str, request_id: str | None = None, **added
) -> JsonResponse:
    """The `error` event with the status chat/protocol/errors.py gives its code."""
    known = error_code(code)
    response = JsonResponse(error_fields(code, message, request_id, **added), status=known.status)
    if known.retry_after is not None:
        response["Retry-After"] = str(known.retry_after)
    return response


def _body(request) -> bytes:
    """The request body (chat/protocol/inputs.py), or ProtocolError `frame_too_large` past a frame's size."""
    try:
        return inputs.body_read(request, limit=MAX_FRAME_BYTES)
    except inputs.InputError:
        raise ProtocolError(
            "frame_too_large", f"the body is over {MAX_FRAME_BYTES} bytes, a prompt frame's limit"
        ) from None


async def _start(request, feed: TurnFeed) -> JsonResponse | None:
    """Parse the body and admit the turn into `feed`; an error response if it was refused."""
    prompt = None
    try:
        prompt = parse_http_prompt(_body(request), max_prompt_chars=settings.CHAT_MAX_PROMPT_CHARS)
        owner = await sync_to_async(owner_of_request)(request)
        turn = await turns.admit(
            owner=owner,
            prompt=prompt,
            send=feed.send,
            address=client_address(
                request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR")
            ),
        )
    except ProtocolError as exc:
        return _error_response(exc.code, exc.message, exc.request_id)
    except turns.TurnError as exc:
        return _error_response(
            exc.code, exc.message, prompt.request_id, left=exc.left, resets_at=exc.resets_at
        )
    feed.follow(turn)
    return None


async def _resume(request, feed: TurnFeed, last_event_id: str) -> JsonResponse | None:
    """Attach `feed` to the answer a `Last-Event-ID` names; an error response if it cannot."""
    try:
        resume = parse_last_event_id(last_event_id)
        owner = await sync_to_async(owner_of_request)(request)
        turn = await turns.turn_resume(owner=owner, resume=resume, send=feed.send)
    except (ProtocolError, turns.TurnError) as exc:
        return _error_response(exc.code, exc.message)
    feed.follow_resumed(turn)
    return None


def _sse(event, message: int | None) -> str:
    """One event as SSE; a numbered one with its `id:`, which Last-Event-ID sends back."""
    if event is KEEPALIVE:
        return event
    seq = getattr(event, "seq", None)
    head = f"id: {event_id(message, seq)}\n" if message is not None and seq is not None else ""
    return f"{head}data: {event_json(event)}\n\n"


@require_POST
async def chat_stream(request):
    """The turn's events as server-sent events, as they happen; with `Last-Event-ID`, the rest
    of the answer it names (the body is then not read as a prompt)."""
    feed = TurnFeed()
    last_event_id = request.headers.get("Last-Event-ID")
    if last_event_id:
        refused = await _resume(request, feed, last_event_id)
        message = parse_last_event_id(last_event_id).message if refused is None else None
    else:
        refused = await _start(request, feed)
        message = feed.turn.message_id if feed.turn is not None else None
    if refused is not None:
        return refused

    async def stream():
        try:
            async for batch in feed.batches_until_end():
                # One write for all; bytes, or Django looks the charset up for every chunk.
                yield "".join([_sse(event, message) for event in batch]).encode()
        finally:
            # Django cancels this generator when the client disconnects; a finished turn ignores it.
            feed.abandon(resumable=True)

    return sse_response(request, stream())


@require_POST
async def chat(request):
    """The turn's final `done` event as JSON, or its `error` with a fitting status."""
    feed = TurnFeed()
    refused = await _start(request, feed)
    if refused is not None:
        return refused
    done = error = None
    try:
        for event in await feed.all_events():
            if isinstance(event, events.Done):
                done = event
            elif isinstance(event, events.Error) and event.code != "storage_failed":
                error = event
    finally:
        feed.abandon()  # a no-op unless the client left before the end
    if done is not None:
        return JsonResponse(events.event_fields(done))
    error = error or events.Error(
        feed.turn.request_id, "model_error", "the answer ended without a result"
    )
    return _error_response(error.code, error.message, error.request_id)


@require_POST
async def cancel(request):
    """Stop one of the caller's answers, in this process or another; says what happened."""
    try:
        message_id = parse_http_cancel(_body(request))
        owner = await sync_to_async(owner_of_request)(request)
        result = await turns.turn_cancel(owner=owner, message_id=message_id)
    except (ProtocolError, turns.TurnError) as exc:
        return _error_response(exc.code, exc.message)
    return JsonResponse(
        events.event_fields(events.CancelAck(None, message=message_id, result=result))
    )


@require_GET
def csrf(request):
    """Sets the session and csrftoken cookies; returns the token for the X-CSRFToken header."""
    owner_of_request(request)  # a client without a session gets one, so its answers stay its own
    return JsonResponse({"csrf_token": get_token(request)})


def csrf_failure(request, reason: str = ""):
    """CSRF_FAILURE_VIEW: an `error` event for API clients, Django's page for everything else."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            error_fields(
                "csrf_failed",
                f"CSRF check failed ({reason}); GET /api/csrf and send its "
                "token in an X-CSRFToken header with the cookies",
            ),
            status=403,
        )
    return django_csrf_failure(request, reason)
