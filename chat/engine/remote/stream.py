"""One streamed chat completion over HTTP, from an OpenAI-compatible server, read by a thread.

`Stream` sends `POST {base_url}/chat/completions` with `stream: true` on a blocking socket and
hands what it reads to sse.py's `AnswerReader` (SSE events, stop strings held back, how it
ended); a refused optional field is dropped and the request sent once more (capabilities.py
learns it). Cancellation closes the upstream socket at once (a watcher shuts it down, so a read
waiting for the next token returns). Errors become EngineError, a context-length refusal
PromptTooLong. loop_stream.py reads the same stream on an event loop instead, without a thread.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from ..types import GenerationRequest, GenerationResult, OnText
from .capabilities import Capabilities
from .sse import ERROR_BODY_BYTES, AnswerReader, raise_unreachable, refusal, request_body

# How often a stream's cancel watcher looks whether the stream ended by itself; a cancel wakes it
# at once. Rarely: eight streams polling every 50 ms woke the process about as often as their
# tokens did; an ended stream's watcher lingers this long at most.
_WATCH_SECONDS = 1.0
# What one read takes from the socket at most.
_READ_BYTES = 1 << 16


class Endpoint:
    """Where a server's OpenAI-compatible API is (`base_url`, the path before
    /chat/completions) and the key it wants."""

    def __init__(self, base_url: str, api_key: str = ""):
        url = urlsplit(base_url)
        if url.scheme not in {"http", "https"} or not url.hostname:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        self.base_url = base_url
        self.api_key = api_key
        self._url = url
        self.path = url.path.rstrip("/")
        self.target = f"{base_url.rstrip('/')}/chat/completions"
        self.host = url.hostname
        self.tls = url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)

    def headers(self) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.tls else http.client.HTTPConnection
        return kind(self.host, self._url.port, timeout=timeout)

    def ssl_context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context() if self.tls else None

    def post_head(self, length: int) -> bytes:
        """The request line and headers of a completion POST whose JSON body is `length` bytes,
        as http.client sends them."""
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        if self._url.port is not None:
            host += f":{self._url.port}"
        lines = [
            f"POST {self.path}/chat/completions HTTP/1.1",
            f"Host: {host}",
            "Accept-Encoding: identity",
            *(f"{name}: {value}" for name, value in self.headers().items()),
            "Content-Type: application/json",
            f"Content-Length: {length}",
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class StreamedAnswer:
    """One streamed completion's request, server and reader, whichever way it is read: on the
    calling thread (`Stream`) or on the event loop (loop_stream.py's `LoopStream`)."""

    def __init__(
        self,
        endpoint: Endpoint,
        capabilities: Capabilities,
        timeout: float,
        request: GenerationRequest,
        on_text: OnText,
        body: dict[str, Any],
    ):
        self.endpoint = endpoint
        self.capabilities = capabilities
        self.timeout = timeout
        self.request = request
        self.body = body
        self.reader = AnswerReader(request, on_text, capabilities)


class Stream(StreamedAnswer):
    """One streamed completion on the calling thread: send, read, hand on, map the end."""

    def run(self) -> GenerationResult:
        started = time.perf_counter()
        try:
            body = self.capabilities.body(self.body)
            # A refused optional field is dropped and the request sent once more without it.
            without = self._attempt(body, may_retry=True)
            if without is not None:
                self._attempt(without, may_retry=False)
        except (OSError, http.client.HTTPException) as exc:
            raise_unreachable(
                exc, self.request, self.capabilities, self.endpoint.target, self.timeout
            )
        return self.reader.result(started, time.perf_counter())

    def _attempt(self, body: dict[str, Any], *, may_retry: bool) -> dict[str, Any] | None:
        """Send `body` and read its stream; the body to send again when a field was refused."""
        endpoint = self.endpoint
        connection = endpoint.connection(self.timeout)
        ended = threading.Event()
        try:
            connection.connect()
            sock = connection.sock  # kept: getresponse() may hand the socket to the response
            threading.Thread(
                target=self._watch_cancel, args=(sock, ended), name="remote-cancel", daemon=True
            ).start()
            connection.request(
                "POST",
                f"{endpoint.path}/chat/completions",
                body=request_body(body),
                headers={**endpoint.headers(), "Content-Type": "application/json"},
            )
            response = connection.getresponse()
            if response.status != 200:
                raw = response.read(ERROR_BODY_BYTES)
                return refusal(
                    response.status,
                    raw,
                    body,
                    self.capabilities,
                    endpoint.target,
                    may_retry=may_retry,
                )
            self.reader.accepted(body)
            self._read(response)
            return None
        finally:
            ended.set()
            connection.close()

    def _watch_cancel(self, sock: socket.socket, ended: threading.Event) -> None:
        """Shut the socket down the moment the request is cancelled, waking a read blocked on the next token."""
        while not ended.is_set():
            if self.request.cancel.wait(_WATCH_SECONDS):
                if not ended.is_set():
                    with contextlib.suppress(OSError):  # already closed
                        sock.shutdown(socket.SHUT_RDWR)
                return

    def _read(self, response: http.client.HTTPResponse) -> None:
        """Hand the body on as it arrives (read1, not line by line) until nothing more is
        wanted, the stream ends, or a cancel."""
        reader = self.reader
        while not self.request.cancel.is_set():
            block = response.read1(_READ_BYTES)
            if not block:
                break  # connection closed (by the server, or by the cancel watcher)
            if reader.feed(block):
                return
        reader.check_ended()
