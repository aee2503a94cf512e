"""A small HTTP service on loopback for the hooks that ask one: it answers what a test sets and
records every request it was sent (POSTs and the GET a followed redirect would make)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Stub:
    """What the stub answers (status, JSON or raw body, extra headers, after a delay) and what
    it was sent."""

    status: int = 200
    reply: object = None
    raw: bytes | None = None
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    seen: list[dict] = field(default_factory=list)
    url: str = ""


@contextmanager
def serving() -> Iterator[Stub]:
    state = Stub()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            self._answer(json.loads(self.rfile.read(length)))

        def do_GET(self) -> None:
            self._answer(None)

        def _answer(self, body) -> None:
            state.seen.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "body": body,
                    "headers": dict(self.headers),
                }
            )
            time.sleep(state.delay_s)
            payload = state.raw if state.raw is not None else json.dumps(state.reply).encode()
            try:
                self.send_response(state.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in state.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the hook gave up waiting

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def moderation_reply(flagged: dict[str, bool], scores: dict[str, float] | None = None) -> dict:
    return {
        "id": "modr-1",
        "model": "omni-moderation-latest",
        "results": [
            {
                "flagged": any(flagged.values()),
                "categories": flagged,
                "category_scores": scores or {name: float(hit) for name, hit in flagged.items()},
            }
        ],
    }
