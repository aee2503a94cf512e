"""One streamed chat completion read on the event loop: stream.py's `Stream` without a thread.

The socket's bytes arrive in an asyncio protocol's `data_received` on the loop; there they are
de-chunked and handed to the same `AnswerReader` (sse.py) the blocking stream uses, so `on_text`
runs on the loop's own thread: no reader thread per stream and no hand-off per token. The
request body, the retry without a refused field, the errors and what a cancel returns are the
blocking stream's. A cancel closes the upstream at once: the task running `run` is cancelled
(the scheduler's `cancel`), or, for a cancel flag set without it, a check once a second.

The HTTP/1.1 response (status line, headers, a chunked, sized or close-delimited body) is read
by hand here, about 100 lines, into a buffer of its own. aiohttp's client, measured beside it
(8 scripted streams read into the same AnswerReader), cost 0.072-0.086 CPU ms a token against
0.030-0.044 here: its response goes through its StreamReader and a wake-up of the reading task
per token, each read is a fresh bytes object, and its session is bound to one loop.
"""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Callable
from typing import Any

from ..types import GenerationRequest, GenerationResult
from .sse import ERROR_BODY_BYTES, AnswerReader, raise_unreachable, refusal, request_body
from .stream import StreamedAnswer

# How often a stream looks at its cancel flag when nobody cancelled its task.
_WATCH_SECONDS = 1.0
_MAX_HEAD_BYTES = 1 << 16
# What one read takes from the socket at most, into the response's own buffer.
_READ_BYTES = 1 << 16


class LoopStream(StreamedAnswer):
    """One streamed completion as a coroutine on the running loop (see the module doc)."""

    async def run(self) -> GenerationResult:
        started = time.perf_counter()
        try:
            body = self.capabilities.body(self.body)
            # A refused optional field is dropped and the request sent once more without it.
            without = await self._attempt(body, may_retry=True)
            if without is not None:
                await self._attempt(without, may_retry=False)
        except asyncio.CancelledError:
            if not self.request.cancel.is_set():
                raise  # not ours: the loop is going away
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the scheduler's cancel, answered with the result as it stands
        except (OSError, http.client.HTTPException) as exc:
            raise_unreachable(
                exc, self.request, self.capabilities, self.endpoint.target, self.timeout
            )
        return self.reader.result(started, time.perf_counter())

    async def _attempt(self, body: dict[str, Any], *, may_retry: bool) -> dict[str, Any] | None:
        """Send `body` and read its stream; the body to send again when a field was refused."""
        endpoint, loop = self.endpoint, asyncio.get_running_loop()
        response = _Response(loop, self.reader, self.request, lambda: self.reader.accepted(body))
        watch: asyncio.TimerHandle | None = None

        def check() -> None:
            """The cancel flag, and silence: one timer per stream, not one per token."""
            nonlocal watch
            now = loop.time()
            if self.request.cancel.is_set():
                response.end()
            elif now - response.heard_at >= self.timeout:
                response.fail(TimeoutError())
            else:
                wake = min(now + _WATCH_SECONDS, response.heard_at + self.timeout)
                watch = loop.call_at(wake, check)

        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancel that comes
            # as the connection is made, and the stream would go on.
            async with asyncio.timeout(self.timeout):
                await loop.create_connection(
                    lambda: response,
                    endpoint.host,
                    endpoint.port,
                    ssl=endpoint.ssl_context(),
                )
            payload = request_body(body)
            response.send(endpoint.post_head(len(payload)) + payload)
            watch = loop.call_at(loop.time() + min(_WATCH_SECONDS, self.timeout), check)
            await response.ended
            if not response.status:  # closed before a status line
                if self.request.cancel.is_set():
                    return None
                raise http.client.RemoteDisconnected(
                    "Remote end closed connection without response"
                )
            if response.status != 200:
                return refusal(
                    response.status,
                    bytes(response.refused),
                    body,
                    self.capabilities,
                    endpoint.target,
                    may_retry=may_retry,
                )
            self.reader.check_ended()
            return None
        finally:
            if watch is not None:
                watch.cancel()
            response.close()


class _Response(asyncio.BufferedProtocol):
    """One HTTP/1.1 response as it arrives: the head, then the body de-chunked, handed to the
    reader for a 200 and kept (up to 64 KB) for any other status. `ended` resolves once
    nothing more is wanted or the connection closed, or fails with what went wrong.

    Read into a buffer of its own (BufferedProtocol): a plain Protocol gets a new bytes object
    from `recv(256 KiB)` for every read, whose allocation cost more than parsing the event
    (reading 8 scripted streams: 0.061-0.071 CPU ms a token that way, 0.030-0.043 this way)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: AnswerReader,
        request: GenerationRequest,
        on_accepted: Callable[[], None],
    ):
        self.loop, self.reader, self.request = loop, reader, request
        self.on_accepted = on_accepted
        self.ended: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.heard_at = loop.time()
        self.status = 0
        self.refused = bytearray()
        self._buffer = memoryview(bytearray(_READ_BYTES))
        self._head = b""
        self._body: _Body | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's

    def send(self, data: bytes) -> None:
        assert self.transport is not None  # connected: create_connection returned
        self.transport.write(data)
        self.heard_at = self.loop.time()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._buffer[:nbytes]))

    def data_received(self, data: bytes) -> None:
        self.heard_at = self.loop.time()
        if self.ended.done() or self.request.cancel.is_set():
            self.end()
            return
        try:
            if self._body is None:
                data = self._read_head(data)
                if self._body is None:
                    return
            body = self._body.feed(data)
            if self.status == 200:
                if body and self.reader.feed(body):
                    self.end()
                    return
            elif len(self.refused) < ERROR_BODY_BYTES:
                self.refused += body
            if self._body.finished:
                self.end()
        except Exception as exc:  # a malformed response or event, a failure mid-answer
            self.fail(exc)

    def eof_received(self) -> bool:
        self.end()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self.end()
        else:
            self.fail(exc)

    def end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)
        self.close()

    def fail(self, exc: BaseException) -> None:
        if not self.ended.done():
            self.ended.set_exception(exc)
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()  # at once, whatever is unsent: the server hears the close now
            self.transport = None

    def _read_head(self, data: bytes) -> bytes:
        """Take the status line and headers from the front of `data`; the rest is body."""
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > _MAX_HEAD_BYTES:
                raise http.client.LineTooLong("the response head")
            return b""
        head, rest = self._head[:end].decode("latin-1"), self._head[end + 4 :]
        self._head = b""
        status_line, *lines = head.split("\r\n")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise http.client.BadStatusLine(status_line)
        status = int(parts[1])
        if 100 <= status < 200:  # an interim answer (103 Early Hints): the real one follows
            return self._read_head(rest) if rest else b""
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.status = status
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._body = _Chunked()
        elif "content-length" in headers:
            self._body = _Body(int(headers["content-length"]))
        else:
            self._body = _Body(None)  # to the close
        if status == 200:
            self.on_accepted()
        return rest


class _Body:
    """A body of `length` bytes, or (None) one that lasts until the connection closes."""

    def __init__(self, length: int | None):
        self.left = length
        self.finished = length == 0

    def feed(self, data: bytes) -> bytes:
        if self.left is None:
            return data
        data = data[: self.left]
        self.left -= len(data)
        self.finished = self.left == 0
        return data


class _Chunked(_Body):
    """A chunked body: each chunk's size line, its bytes, and the CRLF after them."""

    def __init__(self) -> None:
        super().__init__(None)
        self._chunk_left = 0  # bytes of the current chunk still to come
        self._skip = 0  # bytes of the CRLF after a chunk still to come
        self._size_line = b""

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        at, size = 0, len(data)
        while at < size and not self.finished:
            if self._chunk_left:
                piece = data[at : at + self._chunk_left]
                out.append(piece)
                at += len(piece)
                self._chunk_left -= len(piece)
                if not self._chunk_left:
                    self._skip = 2
            elif self._skip:
                step = min(self._skip, size - at)
                at += step
                self._skip -= step
            else:
                newline = data.find(b"\n", at)
                if newline < 0:
                    self._size_line += data[at:]
                    if len(self._size_line) > 1024:
                        raise http.client.LineTooLong("a chunk's size line")
                    break
                line, self._size_line = self._size_line + data[at:newline], b""
                at = newline + 1
                try:
                    self._chunk_left = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise http.client.IncompleteRead(line) from None
                self.finished = self._chunk_left == 0  # trailers, if any, are not wanted
        return out[0] if len(out) == 1 else b"".join(out)
