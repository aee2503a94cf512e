"""A server-sent stream's response, its body written straight through the ASGI server's `send`.

Django streams a `StreamingHttpResponse` through four generators of its own for every piece
(`__aiter__`, `streaming_content`'s wrapper, `make_bytes`, `chunk_bytes`); a relayed answer
writes a piece per token, so those layers cost about as much as the write itself. Here the view
still does everything a response needs (authentication, parsing, admission, status and headers,
every middleware), and only the body goes around Django: `ServerSend` keeps the server's `send`
in the request's scope, and the response's iterator writes each piece with one `send` call,
yielding nothing. Django has sent the status and headers before it asks for the first piece and
sends the end after the last, so the wire is the same bytes either way. Without the server's
`send` (Django's test client, another entry point) the pieces go through Django as before.
A middleware that rewrites a streaming body (GZipMiddleware) would not see these pieces: none is
installed, and an event stream is not worth compressing (each piece is one token).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from django.http import StreamingHttpResponse

# Where `ServerSend` puts the server's `send` in an HTTP request's ASGI scope.
SCOPE_KEY = "chat.server_send"


class ServerSend:
    """ASGI middleware in front of Django: an HTTP request's scope carries the server's `send`."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope = {**scope, SCOPE_KEY: send}
        return await self.app(scope, receive, send)


def sse_response(request, body: AsyncIterator[bytes]) -> StreamingHttpResponse:
    """`body`'s pieces as a `text/event-stream` response, each piece one write to the client.

    `body` must clean up in its own `finally` (a client that goes away cancels the request's
    task while it waits), as it would under Django's iteration."""
    send = getattr(request, "scope", {}).get(SCOPE_KEY)
    content = body if send is None else _written(body, send)
    response = StreamingHttpResponse(content, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


async def _written(body: AsyncIterator[bytes], send) -> AsyncIterator[bytes]:
    """Writes every piece of `body` with `send`; yields none (Django then sends only the end)."""
    async with aclosing(body) as pieces:  # type: ignore[type-var]
        async for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    return
    yield b""  # an async generator, for Django's `aiter`, that never yields
