"""One streamed answer's SSE events read into text, whatever reads the socket.

The blocking stream (stream.py, a thread per stream) and the event-loop stream (loop_stream.py)
both hand the bytes they read to one `AnswerReader`: it splits them into `data:` events, parses
them with orjson, holds back stop strings (never shown), counts, and maps how the answer ended.
The functions below turn a refused request or a broken connection into the same EngineError
for both.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import time
from typing import Any

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

# The longest line an event may have, and the most of a refusal's body that is read.
_MAX_LINE_BYTES = 1 << 20
ERROR_BODY_BYTES = 1 << 16
# vLLM: "maximum context length is"; OpenAI: code context_length_exceeded; TGI: "must be <= N".
_CONTEXT_ERROR = re.compile(
    r"context[ _]length|maximum context|must be <=|too many tokens|prompt is too long", re.I
)


class AnswerReader:
    """The text of one streamed answer, from the bytes of its SSE body as they arrive.

    `feed` takes any piece of the body (lines may be split anywhere); the events of one piece
    are parsed together and their text handed to `on_text` as one piece, so tokens that came
    together cost one hand-off, and one that came alone is not held back. Lines stay bytes
    (orjson parses them as they are): this runs once per token.
    """

    def __init__(self, request: GenerationRequest, on_text: OnText, capabilities: Capabilities):
        self.request = request
        self.on_text = on_text
        self.capabilities = capabilities
        self.holdback = StopStringHoldback(request.params.stop_strings)
        self.shown: list[str] = []
        self._pending: list[str] = []  # visible text of the events read together, not yet shown
        self._data: list[bytes] = []  # the `data:` lines of the event being read
        self._rest = b""  # the start of a line whose end has not arrived
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.upstream_finish: str | None = None
        self.stop_reason = None
        self.first_token_at: float | None = None
        self.stop_sent = False
        self.done = False  # [DONE] read, or a stop string: nothing after it is wanted

    def accepted(self, body: dict[str, Any]) -> None:
        """The server answered 200 to `body`: its stream follows."""
        self.capabilities.saw(chat="ok")
        self.stop_sent = "stop" in body

    def feed(self, block: bytes) -> bool:
        """Read a piece of the body; True once nothing more is wanted ([DONE], a stop string)."""
        *lines, self._rest = (self._rest + block).split(b"\n")
        if len(self._rest) > _MAX_LINE_BYTES:
            raise EngineError("the inference server sent a line of over 1 MB")
        data = self._data
        try:
            for raw in lines:
                line = raw.rstrip(b"\r")
                if line.startswith(b"data:"):
                    data.append(line[6:] if line.startswith(b"data: ") else line[5:])
                    continue
                if line or not data:
                    continue  # comments (":"), other fields, stray blank lines
                payload = data[0] if len(data) == 1 else b"\n".join(data)
                data.clear()
                if payload.strip() == b"[DONE]":
                    self.done = True
                    return True
                self._event(payload)
                if self.holdback.stopped:
                    if self.stop_sent:  # it was asked to stop there, and streamed it anyway
                        self.capabilities.saw(stop="ignored")
                    self.done = True  # the server streamed one of our stop strings
                    return True
        finally:
            self._show_pending()
        return False

    def check_ended(self) -> None:
        """The body ended: refuse an answer the server cut off before saying how it ended."""
        if (
            not self.done
            and not self.request.cancel.is_set()
            and self.upstream_finish is None
            and not self.holdback.stopped
        ):
            raise EngineUnavailable(
                "the inference server closed the stream before the answer ended"
            )

    def result(self, started: float, finished: float) -> GenerationResult:
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


def request_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def refusal(
    status: int,
    raw: bytes,
    body: dict[str, Any],
    capabilities: Capabilities,
    target: str,
    *,
    may_retry: bool,
) -> dict[str, Any]:
    """A request answered `status` with `raw`: the body to send once more without the optional
    fields it refused (when `may_retry`), else the readable error raised."""
    text = raw[:ERROR_BODY_BYTES].decode("utf-8", errors="replace")
    try:
        payload = json.loads(text)
    except ValueError:
        payload = text.strip()[:300]
    message = _error_message(payload)
    if status >= 500:
        capabilities.saw(chat=f"HTTP {status}")
    if not _is_context_error(status, message, payload):
        refused = capabilities.refused_in(status, message, body)
        if refused and may_retry:
            return {k: v for k, v in body.items() if k not in refused}
    raise _http_error(status, message, payload, target)


def raise_unreachable(
    exc: OSError | http.client.HTTPException,
    request: GenerationRequest,
    capabilities: Capabilities,
    target: str,
    timeout: float,
) -> None:
    """A connection that failed as EngineUnavailable; nothing when it failed because the
    request was cancelled (the cancel closed it)."""
    if isinstance(exc, ConnectionRefusedError):
        capabilities.saw(chat="unreachable")
        raise EngineUnavailable(
            f"the inference server at {target} refused the connection (is it running?)"
        ) from None
    if request.cancel.is_set():
        return
    if isinstance(exc, TimeoutError):
        capabilities.saw(chat="silent")
        raise EngineUnavailable(
            f"the inference server at {target} sent nothing for {timeout:g} s"
        ) from None
    capabilities.saw(chat="unreachable")
    raise EngineUnavailable(
        f"the connection to the inference server at {target} failed: {exc}"
    ) from None


def _error_message(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload))  # FastAPI: "detail"
        if isinstance(error, dict):
            return str(error.get("message") or error)
        return str(error)
    return str(payload)


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
