"""One streamed chat completion over HTTP, from an OpenAI-compatible server.

`Stream` sends `POST {base_url}/chat/completions` with `stream: true`, reads its SSE events,
holds back stop strings (never shown), and maps how it ended; a refused optional field is
dropped and the request sent once more (capabilities.py learns it). Cancellation closes the
upstream socket at once (a watcher shuts it down, so a read waiting for the next token
returns). Errors become EngineError, a context-length refusal PromptTooLong.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from typing import Any, cast
from urllib.parse import urlsplit

import orjson

from ..text.holdback import StopStringHoldback
from ..types import (
    EngineError,
    EngineUnavailable,
    GenerationRequest,
    GenerationResult,
    OnText,
    PromptTooLong,
)
from .capabilities import Capabilities

# How often a stream's cancel watcher looks whether the stream ended by itself; a cancel wakes it
# at once. Rarely: eight streams polling every 50 ms woke the process about as often as their
# tokens did; an ended stream's watcher lingers this long at most.
_WATCH_SECONDS = 1.0
# What one read takes from the socket at most, and the longest line an event may have.
_READ_BYTES = 1 << 16
_MAX_LINE_BYTES = 1 << 20
# vLLM: "maximum context length is"; OpenAI: code context_length_exceeded; TGI: "must be <= N".
_CONTEXT_ERROR = re.compile(
    r"context[ _]length|maximum context|must be <=|too many tokens|prompt is too long", re.I
)


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

    def headers(self) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        kind = (
            http.client.HTTPSConnection
            if self._url.scheme == "https"
            else http.client.HTTPConnection
        )
        host = cast(str, self._url.hostname)  # __init__ refused a URL without one
        return kind(host, self._url.port, timeout=timeout)


class Stream:
    """One streamed completion: send, read SSE events, hold back stop strings, map the end."""

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
        self.on_text = on_text
        self.body = body
        self.holdback = StopStringHoldback(request.params.stop_strings)
        self.shown: list[str] = []
        self._pending: list[str] = []  # visible text of the events read together, not yet shown
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.upstream_finish: str | None = None
        self.stop_reason = None
        self.first_token_at: float | None = None
        self.stop_sent = False

    def run(self) -> GenerationResult:
        started = time.perf_counter()
        target = f"{self.endpoint.base_url.rstrip('/')}/chat/completions"
        caps = self.capabilities
        try:
            body = caps.body(self.body)
            # A refused optional field is dropped and the request sent once more without it.
            without = self._attempt(body, target, may_retry=True)
            if without is not None:
                self._attempt(without, target, may_retry=False)
        except TimeoutError:
            if not self.request.cancel.is_set():
                caps.saw(chat="silent")
                raise EngineUnavailable(
                    f"the inference server at {target} sent nothing for {self.timeout:g} s"
                ) from None
        except ConnectionRefusedError:
            caps.saw(chat="unreachable")
            raise EngineUnavailable(
                f"the inference server at {target} refused the connection (is it running?)"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            if not self.request.cancel.is_set():
                caps.saw(chat="unreachable")
                raise EngineUnavailable(
                    f"the connection to the inference server at {target} failed: {exc}"
                ) from None
        finished = time.perf_counter()
        tail = self.holdback.finish()
        if tail:
            self._show(tail)
        usage = self.usage or {}
        return GenerationResult(
            text="".join(self.shown),
            finish_reason=self._finish_reason(),
            new_tokens=int(usage.get("completion_tokens") or self.chunks),
            prompt_tokens=int(usage.get("prompt_tokens") or len(self.request.input_ids)),
            started_at=started,
            first_token_at=self.first_token_at,
            finished_at=finished,
        )

    def _attempt(
        self, body: dict[str, Any], target: str, *, may_retry: bool
    ) -> dict[str, Any] | None:
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
                body=json.dumps(body).encode(),
                headers={**endpoint.headers(), "Content-Type": "application/json"},
            )
            response = connection.getresponse()
            if response.status != 200:
                status, message, payload = _error_of(response)
                if status >= 500:
                    self.capabilities.saw(chat=f"HTTP {status}")
                if not _is_context_error(status, message, payload):
                    refused = self.capabilities.refused_in(status, message, body)
                    if refused and may_retry:
                        return {k: v for k, v in body.items() if k not in refused}
                raise _http_error(status, message, payload, target)
            self.capabilities.saw(chat="ok")
            self.stop_sent = "stop" in body
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
        """Consume `data:` events (SSE) until [DONE], the end of the stream, or a cancel.

        Read as it arrives (read1), not line by line: the events of one read are parsed
        together and their text handed on as one piece, so tokens that came together cost one
        hand-off, and one that came alone is not held back. Lines stay bytes (orjson parses
        them as they are): this runs once per token."""
        data: list[bytes] = []
        rest = b""
        while not self.request.cancel.is_set():
            block = response.read1(_READ_BYTES)
            if not block:
                break  # connection closed (by the server, or by the cancel watcher)
            *lines, rest = (rest + block).split(b"\n")
            if len(rest) > _MAX_LINE_BYTES:
                raise EngineError("the inference server sent a line of over 1 MB")
            try:
                for raw in lines:
                    line = raw.rstrip(b"\r")
                    if line.startswith(b"data:"):
                        data.append(line[6:] if line.startswith(b"data: ") else line[5:])
                        continue
                    if line or not data:
                        continue  # comments (":"), other fields, stray blank lines
                    payload, data = data[0] if len(data) == 1 else b"\n".join(data), []
                    if payload.strip() == b"[DONE]":
                        return
                    self._event(payload)
                    if self.holdback.stopped:
                        if self.stop_sent:  # it was asked to stop there, and streamed it anyway
                            self.capabilities.saw(stop="ignored")
                        return  # the server streamed one of our stop strings: nothing after it is wanted
            finally:
                self._show_pending()
        if (
            not self.request.cancel.is_set()
            and self.upstream_finish is None
            and not self.holdback.stopped
        ):
            raise EngineUnavailable(
                "the inference server closed the stream before the answer ended"
            )

    def _event(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            event = None  # orjson refuses invalid UTF-8, which the json module read replaced
            with contextlib.suppress(ValueError):
                event = json.loads(payload.decode("utf-8", errors="replace"))
        if not isinstance(event, dict):
            shown = payload[:200].decode("utf-8", errors="replace")
            raise EngineError(f"the inference server sent a malformed event: {shown!r}")
        if "error" in event:  # vLLM reports a failure mid-stream this way
            raise EngineError(f"the inference server failed mid-answer: {_error_message(event)}")
        if event.get("usage"):
            self.usage = event["usage"]
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                self.chunks += 1
                self.first_token_at = self.first_token_at or time.perf_counter()
                visible = self.holdback.feed(text)
                if visible:
                    self._pending.append(visible)
            if choice.get("finish_reason"):
                self.upstream_finish = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")

    def _show_pending(self) -> None:
        if self._pending:
            text = self._pending[0] if len(self._pending) == 1 else "".join(self._pending)
            self._pending.clear()
            self._show(text)

    def _show(self, text: str) -> None:
        self.shown.append(text)
        self.on_text(text)

    def _finish_reason(self) -> str:
        # A natural end the server already reported wins over a cancel that came after it.
        if self.holdback.stopped:
            return "stop_string"
        if self.upstream_finish == "length":
            return "length"
        if self.upstream_finish is None and self.request.cancel.is_set():
            return "cancelled"
        # vLLM says which stop fired (stop_reason: the string, or a token id); others only say "stop".
        if (
            isinstance(self.stop_reason, str)
            and self.stop_reason in self.request.params.stop_strings
        ):
            return "stop_string"
        return "eos"  # "stop", a [DONE] without a reason, or a reason we do not know ("content_filter")


def _error_message(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload))  # FastAPI: "detail"
        if isinstance(error, dict):
            return str(error.get("message") or error)
        return str(error)
    return str(payload)


def _error_of(response: http.client.HTTPResponse) -> tuple[int, str, object]:
    """(status, readable message, parsed body) of a refused request."""
    raw = response.read(1 << 16).decode("utf-8", errors="replace")
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = raw.strip()[:300]
    return response.status, _error_message(payload), payload


def _is_context_error(status: int, message: str, payload: Any) -> bool:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = (
        error.get("code") if isinstance(error, dict) else None
    )  # OpenAI: "context_length_exceeded"
    return status in (400, 413, 422) and (
        code == "context_length_exceeded" or bool(_CONTEXT_ERROR.search(message))
    )


def _http_error(status: int, message: str, payload: Any, target: str) -> EngineError:
    """A readable error for a refused request; a context-length refusal is PromptTooLong."""
    if _is_context_error(status, message, payload):
        return PromptTooLong(f"the prompt is too long for the model: {message}")
    if status in (401, 403):
        return EngineError(
            f"the inference server refused our credentials (HTTP {status}): {message}"
        )
    return EngineError(f"the inference server at {target} answered HTTP {status}: {message}")
