"""An inference server (vLLM, text-generation-inference) behind the OpenAI-compatible streaming chat API.

`OpenAIBackend` stands in for `LocalBackend`: the rest of the app renders, counts,
caches and streams the same way, but tokens come from `POST {base_url}/chat/completions`
with `stream: true`. What has no remote meaning is decided here:

- `render(messages)` is a canonical JSON of the messages: that, not a local template,
  is what the server receives, so it is what the cache key must cover.
- Token counts (prompt-length guard, history trimming, policy checks) use a local
  tokenizer when one is configured (the served model's tokenizer folder, read by
  file_tokenizer.py: no transformers, no torch); without one the prompt is not counted
  here and the server's "context length" 400 becomes PromptTooLong.
- What the server accepts is found, not assumed (capabilities.py): at start-up
  (`from_config`), and from each refusal, whose named fields are dropped and the request
  sent once more.
- Batching is the server's business: each request streams on its own (concurrent.py).

Cancellation closes the upstream socket at once (a watcher shuts it down, so a read
waiting for the next token returns), which is how vLLM and TGI learn to stop generating.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from ..text.holdback import StopStringHoldback
from ..text.template import (
    continues_answer,
    defuse_markers,
    encode_pieces,
    encode_text,
    render_pieces,
    special_token_pattern,
    tokenizer_digest,
)
from ..types import (
    Backend,
    EngineError,
    GenerationRequest,
    GenerationResult,
    OnText,
    Progress,
    PromptTooLong,
)
from .capabilities import Capabilities, discover

log = logging.getLogger(__name__)


# Seconds each start-up question to the server may take (capabilities.discover).
_DISCOVER_TIMEOUT = 10.0
# How often a stream's cancel watcher looks whether the stream ended by itself; a cancel wakes it at once.
_WATCH_SECONDS = 0.05
# vLLM: "maximum context length is"; OpenAI: code context_length_exceeded; TGI: "must be <= N".
_CONTEXT_ERROR = re.compile(
    r"context[ _]length|maximum context|must be <=|too many tokens|prompt is too long", re.I
)


@dataclass(frozen=True)
class RemoteConfig:
    """Where the inference server is and how to talk to it.

    Args:
        base_url: the API root, e.g. "http://10.0.0.5:8000/v1" (the path before /chat/completions).
        model: the served model's name, sent as `model` in every request.
        api_key: sent as `Authorization: Bearer`; empty sends none.
        timeout: seconds to connect, and the longest wait for the next streamed token.
        context_length: the served model's context in tokens; 0 means unknown (the server decides).
        tokenizer_path: a local tokenizer folder for counting tokens; None counts nothing locally.
        max_new_tokens_cap: server-side ceiling on any request's max_new_tokens (sent as max_tokens).
    """

    base_url: str
    model: str
    api_key: str = ""
    timeout: float = 60.0
    context_length: int = 0
    tokenizer_path: str | None = None
    max_new_tokens_cap: int = 1024


def canonical_messages(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class OpenAIBackend(Backend):
    """Streams answers from an OpenAI-compatible chat completions endpoint.

    Args:
        config: the server's address, model and limits.
        tokenizer: the served model's tokenizer for local counting (a FileTokenizer: no torch), or None.
        capabilities: what the server was found to accept (capabilities.py); a new, empty one by default.
    """

    def __init__(
        self, config: RemoteConfig, tokenizer: Any = None, capabilities: Capabilities | None = None
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.capabilities = capabilities or Capabilities()
        self.model_id = config.model
        # The weights live on the server; its URL and model name are what identify them here.
        self.fingerprint = hashlib.sha256(
            f"{config.base_url.rstrip('/')}\n{config.model}".encode()
        ).hexdigest()
        self._tokenizer_digest = tokenizer_digest(tokenizer) if tokenizer is not None else ""
        # Unknown context: never refuse locally; the server's own check answers.
        self.context_length = config.context_length or 1 << 62
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = [eos] if eos is not None else []
        self._markers = special_token_pattern(tokenizer) if tokenizer is not None else None
        url = urlsplit(config.base_url)
        if url.scheme not in {"http", "https"} or not url.hostname:
            raise ValueError(f"{config.base_url!r} is not an http(s) URL")
        self._url = url
        self._path = url.path.rstrip("/")

    @classmethod
    def from_config(cls, config: RemoteConfig, progress: Progress = log.info) -> OpenAIBackend:
        tokenizer = None
        if config.tokenizer_path:
            from ..text.file_tokenizer import FileTokenizer

            progress(f"Reading the tokenizer in {config.tokenizer_path} for token counts...")
            tokenizer = FileTokenizer(config.tokenizer_path)
            if not config.context_length:
                config = _with_context_from(config, Path(config.tokenizer_path))
        progress(f"Remote model {config.model} at {config.base_url}")
        backend = cls(config, tokenizer)
        # Asked with a short timeout: a hung server must not hold the start-up for a minute.
        probing = cls(
            replace(config, timeout=min(config.timeout, _DISCOVER_TIMEOUT)),
            tokenizer,
            capabilities=backend.capabilities,
        )
        discover(probing, progress)
        return backend

    # -- prompts --------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The messages as the server receives them, canonical JSON (the cache key covers this)."""
        return canonical_messages(messages)

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids of what the server receives, as the local tokenizer's template renders it; [] without one."""
        if isinstance(messages, str):
            raise TypeError("encode() takes the messages: a rendered string hides typed markers")
        if self.tokenizer is None:
            return []
        return encode_pieces(self.tokenizer, render_pieces(self.tokenizer, self.sent(messages)))

    def token_count(self, text: str) -> int:
        if self.tokenizer is None:
            return 0
        return len(encode_text(self.tokenizer, text))

    def sent(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as sent: the local tokenizer's special tokens typed in a content defused.

        The server tokenizes the rendered chat whole, so a typed `<|im_end|>` would be the
        real one there. Without a local tokenizer nothing is known to defuse.
        """
        return defuse_markers(messages, self._markers)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse, rather than truncate, a prompt that leaves no room for the answer."""
        PromptTooLong.check(prompt_tokens, max_new_tokens, self.context_length)

    def model_identity(self) -> dict[str, str]:
        """The server's URL and model name: how its weights, dtype and kernels are set is the
        server's own, so one URL and model must mean one way of answering."""
        return {"server": self.fingerprint, "tokenizer": self._tokenizer_digest}

    def request(self, messages: list[dict[str, Any]], **options: Any) -> GenerationRequest:
        """A request for `messages` (convenience for plain Python)."""
        options.setdefault("max_new_tokens", min(256, self.config.max_new_tokens_cap))
        return GenerationRequest.of(self.encode(messages), messages=messages, **options)

    def token_id(self, token: str) -> int | None:
        """Id of a single token in the local tokenizer, or None (then it cannot be sent as a stop token)."""
        if self.tokenizer is None:
            return None
        from ..text.eos import token_id

        return token_id(self.tokenizer, token)

    # -- health ---------------------------------------------------------------

    def probe(self, timeout: float = 1.0) -> str:
        """ "ok" when the server serves our model, else what is wrong.

        `GET {base}/models` listing the model says so; a server whose model list fails
        (`transformers serve` answers it with a 500) while its last completion was
        answered is serving too.
        """
        status = self.models_status(timeout)
        caps = self.capabilities
        if status != "ok" and caps.models.startswith("HTTP") and caps.chat == "ok":
            return "ok"
        return status

    def models_status(self, timeout: float = 1.0) -> str:
        """ "ok" when `GET {base}/models` answers and lists our model, else what is wrong."""
        connection = self._connection(timeout)
        found = "unreachable"
        try:
            connection.request("GET", f"{self._path}/models", headers=self._headers())
            response = connection.getresponse()
            body = response.read(1 << 20)
            if response.status != 200:
                found = f"HTTP {response.status}"
                return f"unavailable: HTTP {response.status} from {self.config.base_url}/models"
            served = [m.get("id") for m in json.loads(body).get("data", [])]
            if self.config.model not in served:
                found = "without our model"
                return f"unavailable: {self.config.model!r} is not served (the server has {served})"
            found = "ok"
            return "ok"
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
            return f"unavailable: {exc or type(exc).__name__}"
        finally:
            connection.close()
            self.capabilities.saw(models=found)

    # -- generation -----------------------------------------------------------

    def generate_batch(
        self, requests: list[GenerationRequest], on_texts: list[OnText]
    ) -> list[GenerationResult]:
        """Stream each request on its own connection, all at once; results in request order."""
        if len(requests) == 1:
            return [self.generate(requests[0], on_texts[0])]
        with ThreadPoolExecutor(
            max_workers=len(requests), thread_name_prefix="remote-batch"
        ) as pool:
            futures = [
                pool.submit(self.generate, r, t) for r, t in zip(requests, on_texts, strict=True)
            ]
            return [f.result() for f in futures]

    def generate(
        self, request: GenerationRequest, on_text: OnText = lambda _text: None
    ) -> GenerationResult:
        """Stream one answer in the calling thread, handing visible text to `on_text`.

        The text handed out, concatenated, is exactly `result.text`.
        """
        if request.messages is None:
            raise EngineError(
                "a remote request needs its chat messages (GenerationRequest.messages)"
            )
        max_new = max(1, min(request.params.max_new_tokens, self.config.max_new_tokens_cap))
        if request.input_ids:
            self.check_fits(len(request.input_ids), max_new)
        stream = _Stream(self, request, on_text, max_new)
        return stream.run()

    def _body(self, request: GenerationRequest, max_new: int) -> dict[str, Any]:
        params = request.params
        body = {
            "model": self.config.model,
            # request() always sets them: a remote server renders the chat itself
            "messages": self.sent(cast("list[dict[str, Any]]", request.messages)),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_new,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            body["seed"] = params.seed  # OpenAI's, vLLM's and TGI's: a reproducible sample
        if params.stop_strings:
            body["stop"] = list(params.stop_strings)
        if params.eos_token_ids:
            body["stop_token_ids"] = list(
                params.eos_token_ids
            )  # vLLM's extension; asked for only by policy
        if params.min_new_tokens:
            body["min_tokens"] = params.min_new_tokens  # vLLM's extension
        if continues_answer(request.messages or []):
            # vLLM's and SGLang's way to go on writing the last assistant message.
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        if params.frequency_penalty:
            body["frequency_penalty"] = params.frequency_penalty
        if params.presence_penalty:
            body["presence_penalty"] = params.presence_penalty
        if params.repetition_penalty != 1.0:
            # vLLM's and SGLang's extension; the n-gram ban has no OpenAI-style field.
            body["repetition_penalty"] = params.repetition_penalty
        if params.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": params.json_schema, "strict": True},
            }
        return body

    def _headers(self) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        kind = (
            http.client.HTTPSConnection
            if self._url.scheme == "https"
            else http.client.HTTPConnection
        )
        host = cast(str, self._url.hostname)  # __init__ refused a URL without one
        return kind(host, self._url.port, timeout=timeout)


def _with_context_from(config: RemoteConfig, folder: Path) -> RemoteConfig:
    """The context length from the tokenizer folder's model config, when it has one."""
    try:
        model_config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return config
    length = model_config.get("max_position_embeddings")
    return replace(config, context_length=int(length)) if length else config


class _Stream:
    """One streamed completion: send, read SSE events, hold back stop strings, map the end."""

    def __init__(
        self, backend: OpenAIBackend, request: GenerationRequest, on_text: OnText, max_new: int
    ):
        self.backend = backend
        self.request = request
        self.on_text = on_text
        self.max_new = max_new
        self.holdback = StopStringHoldback(request.params.stop_strings)
        self.shown: list[str] = []
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.upstream_finish: str | None = None
        self.stop_reason = None
        self.first_token_at: float | None = None
        self.stop_sent = False

    def run(self) -> GenerationResult:
        started = time.perf_counter()
        backend = self.backend
        target = f"{backend.config.base_url.rstrip('/')}/chat/completions"
        caps = backend.capabilities
        try:
            body = caps.body(backend._body(self.request, self.max_new))
            # A refused optional field is dropped and the request sent once more without it.
            without = self._attempt(body, target, may_retry=True)
            if without is not None:
                self._attempt(without, target, may_retry=False)
        except TimeoutError:
            if not self.request.cancel.is_set():
                caps.saw(chat="silent")
                raise EngineError(
                    f"the inference server at {target} sent nothing for {backend.config.timeout:g} s"
                ) from None
        except ConnectionRefusedError:
            caps.saw(chat="unreachable")
            raise EngineError(
                f"the inference server at {target} refused the connection (is it running?)"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            if not self.request.cancel.is_set():
                caps.saw(chat="unreachable")
                raise EngineError(
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
        backend = self.backend
        connection = backend._connection(backend.config.timeout)
        ended = threading.Event()
        try:
            connection.connect()
            sock = connection.sock  # kept: getresponse() may hand the socket to the response
            threading.Thread(
                target=self._watch_cancel, args=(sock, ended), name="remote-cancel", daemon=True
            ).start()
            connection.request(
                "POST",
                f"{backend._path}/chat/completions",
                body=json.dumps(body).encode(),
                headers={**backend._headers(), "Content-Type": "application/json"},
            )
            response = connection.getresponse()
            if response.status != 200:
                status, message, payload = _error_of(response)
                if status >= 500:
                    backend.capabilities.saw(chat=f"HTTP {status}")
                if not _is_context_error(status, message, payload):
                    refused = backend.capabilities.refused_in(status, message, body)
                    if refused and may_retry:
                        return {k: v for k, v in body.items() if k not in refused}
                raise _http_error(status, message, payload, target)
            backend.capabilities.saw(chat="ok")
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
        """Consume `data:` events (SSE) until [DONE], the end of the stream, or a cancel."""
        data: list[str] = []
        while not self.request.cancel.is_set():
            raw = response.readline(1 << 20)
            if not raw:
                break  # connection closed (by the server, or by the cancel watcher)
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
                continue
            if line or not data:
                continue  # comments (":"), other fields, stray blank lines
            payload, data = "\n".join(data), []
            if payload.strip() == "[DONE]":
                return
            self._event(payload)
            if self.holdback.stopped:
                if self.stop_sent:  # it was asked to stop there, and streamed it anyway
                    self.backend.capabilities.saw(stop="ignored")
                return  # the server streamed one of our stop strings: nothing after it is wanted
        if (
            not self.request.cancel.is_set()
            and self.upstream_finish is None
            and not self.holdback.stopped
        ):
            raise EngineError("the inference server closed the stream before the answer ended")

    def _event(self, payload: str) -> None:
        try:
            event = json.loads(payload)
        except ValueError:
            raise EngineError(
                f"the inference server sent a malformed event: {payload[:200]!r}"
            ) from None
        if not isinstance(event, dict):
            raise EngineError(f"the inference server sent a malformed event: {payload[:200]!r}")
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
                    self._show(visible)
            if choice.get("finish_reason"):
                self.upstream_finish = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")

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
