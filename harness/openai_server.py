"""A small OpenAI-compatible streaming chat server on loopback, serving the real local model's tokens.

It speaks the wire format vLLM serves (HTTP/1.1 chunked `text/event-stream`,
`chat.completion.chunk` events, `finish_reason` plus vLLM's `stop_reason`, a final
usage chunk, `data: [DONE]`), so the remote backend is exercised against the real
format and the real model. It notices a client that goes away (the socket reads EOF
or a write fails), sets the generation's cancel flag, and records it all.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from chat.engine.types import GenerationRequest


@dataclass
class Served:
    """What the server saw of one chat completion request."""

    body: dict
    prompt_tokens: int = 0
    chunks_sent: int = 0
    client_gone_at: float | None = None  # perf_counter when the client's close was noticed
    finish_reason: str | None = None  # the local backend's, once generation returned
    new_tokens: int = 0
    done: threading.Event = field(default_factory=threading.Event)


class FakeOpenAIServer:
    """ThreadingHTTPServer in a daemon thread: `GET /v1/models`, `POST /v1/chat/completions`.

    Args:
        backend: the real LocalBackend whose tokens are served.
        model: the name it serves (requests for any other name get 404, as vLLM answers).
        api_key: when set, requests without `Authorization: Bearer <key>` get 401.
        leak_stop_strings: ignore `stop` and stream everything, as a server without stop support would.
        refuse_fields: request fields answered with a 422 naming them, as `transformers serve` does.
        models_status: the HTTP status `GET /v1/models` answers with instead of the list (500 there).
        one_refusal_at_a_time: name only the first refused field, as OpenAI's API does.
    """

    def __init__(
        self,
        backend,
        *,
        model: str = "smollm2-test",
        api_key: str = "",
        leak_stop_strings: bool = False,
        refuse_fields: frozenset[str] = frozenset(),
        models_status: int = 200,
        one_refusal_at_a_time: bool = False,
    ):
        self.backend = backend
        self.model = model
        self.api_key = api_key
        self.leak_stop_strings = leak_stop_strings
        self.refuse_fields = refuse_fields
        self.models_status = models_status
        self.one_refusal_at_a_time = one_refusal_at_a_time
        self.refused: list[dict] = []  # bodies answered with a 422 for refuse_fields
        self.posts = 0  # every POST that reached the completions route
        self.fail_with: int | None = None  # answer every completion with this HTTP status
        self.stall_after_first_chunk = False  # then send nothing more until the client goes away
        self.garbage: bytes | None = None  # sent as the first event's data instead of JSON
        self.served: list[Served] = []
        self.active = 0  # streams open right now
        self._lock = threading.Lock()
        self.httpd = _QuietServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="fake-openai", daemon=True
        )

    def start(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait_for(self, predicate, timeout: float = 120) -> bool:
        """Poll `predicate` until it holds; False after `timeout` (a hang guard, not a timed assertion)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()


class _QuietServer(ThreadingHTTPServer):
    fake: FakeOpenAIServer  # the fake whose behaviour the handlers read

    def handle_error(self, request, client_address):
        """A client that hung up is the point of several tests, not an error worth a traceback."""
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # keep test output quiet
        pass

    @property
    def fake(self) -> FakeOpenAIServer:
        server = self.server
        assert isinstance(server, _QuietServer)
        return server.fake

    def _json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        # vLLM's error shape
        self._json(
            status,
            {"object": "error", "message": message, "type": kind, "param": None, "code": status},
        )

    def _authorised(self) -> bool:
        if self.fake.api_key and self.headers.get("Authorization") != f"Bearer {self.fake.api_key}":
            self._error(401, "Unauthorized", "AuthenticationError")
            return False
        return True

    def do_GET(self):
        if not self._authorised():
            return None
        if self.path.rstrip("/") == "/v1/models":
            if self.fake.models_status != 200:
                return self._error(self.fake.models_status, "Internal Server Error", "ServerError")
            return self._json(
                200, {"object": "list", "data": [{"id": self.fake.model, "object": "model"}]}
            )
        return self._error(404, f"no route {self.path}", "NotFoundError")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if not self._authorised():
            return None
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._error(404, f"no route {self.path}", "NotFoundError")
        with self.fake._lock:
            self.fake.posts += 1
        unexpected = sorted(self.fake.refuse_fields & set(body))
        if self.fake.one_refusal_at_a_time:
            unexpected = unexpected[:1]
        if unexpected:
            self.fake.refused.append(body)
            # transformers serve's answer, word for word
            return self._json(
                422, {"detail": f"Unexpected fields in the request: {set(unexpected)}"}
            )
        if self.fake.fail_with:
            return self._error(
                self.fake.fail_with, "the engine died (simulated)", "InternalServerError"
            )
        if body.get("model") != self.fake.model:
            return self._error(
                404, f"The model `{body.get('model')}` does not exist.", "NotFoundError"
            )
        backend = self.fake.backend
        input_ids = backend.encode(body["messages"])
        max_tokens = int(body.get("max_tokens") or 16)
        if len(input_ids) + max_tokens > backend.context_length:
            return self._error(
                400,
                f"This model's maximum context length is {backend.context_length} tokens. "
                f"However, you requested {len(input_ids) + max_tokens} tokens.",
            )
        served = Served(body=body, prompt_tokens=len(input_ids))
        with self.fake._lock:
            self.fake.served.append(served)
            self.fake.active += 1
        try:
            self._stream(served, input_ids, max_tokens)
        finally:
            with self.fake._lock:
                self.fake.active -= 1
            served.done.set()

    def _stream(self, served: Served, input_ids: list[int], max_tokens: int) -> None:
        body = served.body
        stops = tuple(body.get("stop") or ()) if not self.fake.leak_stop_strings else ()
        request = GenerationRequest.of(
            input_ids,
            max_new_tokens=max_tokens,
            stop_strings=stops,
            eos_token_ids=tuple(body.get("stop_token_ids") or ()),
            temperature=float(body.get("temperature") or 0),
            top_p=float(body.get("top_p") or 1),
            min_new_tokens=int(body.get("min_tokens") or 0),
            seed=body.get("seed"),
        )
        self.close_connection = True  # one stream per connection, as the client uses them
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        completion_id, created = f"chatcmpl-{id(served):x}", int(time.time())

        def chunk(choices: list, usage=None) -> dict:
            event = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.fake.model,
                "choices": choices,
            }
            if usage is not None:
                event["usage"] = usage
            return event

        def send(event) -> bool:
            """One SSE event; False (and the generation cancelled) once the client has gone."""
            if served.client_gone_at is None and self._client_closed():
                served.client_gone_at = time.perf_counter()
            if served.client_gone_at is not None:
                request.cancel.set()
                return False
            data = (
                b"data: "
                + (event if isinstance(event, bytes) else json.dumps(event).encode())
                + b"\n\n"
            )
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError:
                served.client_gone_at = time.perf_counter()
                request.cancel.set()
                return False
            return True

        send(
            chunk(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
        )
        if self.fake.garbage is not None:
            send(self.fake.garbage)

        def on_text(text: str) -> None:
            if send(
                chunk(
                    [
                        {
                            "index": 0,
                            "delta": {"content": text},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
            ):
                served.chunks_sent += 1
                if self.fake.stall_after_first_chunk:
                    select.select(
                        [self.connection], [], [], 60
                    )  # a stuck engine: only the client's close wakes us
                    if served.client_gone_at is None and self._client_closed():
                        served.client_gone_at = time.perf_counter()

        result = self.fake.backend.generate(request, on_text)
        served.finish_reason, served.new_tokens = result.finish_reason, result.new_tokens
        if result.finish_reason == "cancelled":
            return  # the client is gone; nothing more to say
        finish, stop_reason = {"eos": ("stop", None), "length": ("length", None)}.get(
            result.finish_reason, ("stop", stops[0] if len(stops) == 1 else None)
        )
        send(
            chunk(
                [
                    {
                        "index": 0,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": stop_reason,
                    }
                ]
            )
        )
        if (body.get("stream_options") or {}).get("include_usage"):
            send(
                chunk(
                    [],
                    {
                        "prompt_tokens": served.prompt_tokens,
                        "completion_tokens": result.new_tokens,
                        "total_tokens": served.prompt_tokens + result.new_tokens,
                    },
                )
            )
        if send(b"[DONE]"):
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass

    def _client_closed(self) -> bool:
        """True once the client's end of the socket reads EOF (it closed or shut down the connection)."""
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


@contextlib.contextmanager
def closing_upstream(parts: list[bytes], pause_s: float = 0.2) -> Iterator[str]:
    """An HTTP/1.0 server (a body that lasts until it closes: no length, not chunked) answering
    every POST with `parts`, written `pause_s` apart so each is a read of its own; yields its
    base URL."""

    class Upstream(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for part in parts:
                self.wfile.write(part)
                self.wfile.flush()
                time.sleep(pause_s)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()
