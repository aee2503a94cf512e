"""One streaming OpenAI-API client for every server the benchmark compares.

The peer (`transformers serve`), the product's own /v1 on its local engine, and the product in
front of the peer (CHAT_BACKEND=openai) are driven by these same functions with the same prompts,
so their rows differ only by the server. Standard library only: no client library's buffering
sits between a chunk leaving the server and the clock.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from .benchmarking import median
from .in_process import LONG_ANSWER, NEWCOMER


@dataclass
class Target:
    """An OpenAI-compatible server to measure: its base URL (…/v1), model name and key."""

    label: str
    kind: str  # "local" (the product's engine), "peer", or "remote" (the product -> the peer)
    base_url: str
    model: str
    key: str | None = None
    usage: bool = True  # asks for stream_options.include_usage (exact token counts)
    # Forgets cached answers (the product's completion cache), so a repeated prompt is generated.
    reset: Callable[[], object] | None = None


@dataclass
class Stream:
    """One streamed chat completion as the client saw it (perf_counter seconds)."""

    sent: float
    first: float | None = None
    done: float | None = None
    chunks: int = 0
    completion_tokens: int | None = None  # from the server's usage, when it sends one
    finish_reason: str | None = None
    error: str | None = None
    cut: bool = False  # the client closed the stream before it ended

    @property
    def ok(self) -> bool:
        return self.error is None and self.done is not None

    @property
    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.chunks

    @property
    def first_chunk_ms(self) -> float | None:
        return None if self.first is None else (self.first - self.sent) * 1000

    @property
    def total_s(self) -> float | None:
        return None if self.done is None else self.done - self.sent


def stream_chat(
    target: Target,
    prompt: str,
    max_tokens: int,
    *,
    stop: threading.Event | None = None,
    on_first: threading.Event | None = None,
    timeout: float = 600,
) -> Stream:
    """Stream one greedy answer; close the connection when `stop` is set (the server's cancel)."""
    parts = urlsplit(target.base_url)
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
    }
    if target.usage:
        body["stream_options"] = {"include_usage": True}
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if target.key:
        headers["Authorization"] = f"Bearer {target.key}"
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    stream = Stream(sent=time.perf_counter())
    try:
        connection.request(
            "POST", parts.path.rstrip("/") + "/chat/completions", json.dumps(body), headers
        )
        response = connection.getresponse()
        if response.status != 200:
            stream.error = f"HTTP {response.status}: {response.read(300).decode(errors='replace')}"
            return stream
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                stream.completion_tokens = event["usage"].get("completion_tokens")
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    stream.chunks += 1
                    if stream.first is None:
                        stream.first = time.perf_counter()
                        if on_first is not None:
                            on_first.set()
                stream.finish_reason = choice.get("finish_reason") or stream.finish_reason
            if stop is not None and stop.is_set():
                stream.cut = True
                break
        stream.done = time.perf_counter()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    return stream


def together(target: Target, prompts: list[str], max_tokens: int) -> tuple[list[Stream], float]:
    """All prompts at once, one connection each; wall = first sent -> last done."""
    results: list[Stream | None] = [None] * len(prompts)

    def run(i: int, prompt: str) -> None:
        results[i] = stream_chat(target, prompt, max_tokens)

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    streams = [s for s in results if s is not None]
    ended = [s.done for s in streams if s.done is not None]
    wall = max(ended) - min(s.sent for s in streams) if ended else 0.0
    return streams, wall


@dataclass
class NewcomerOverHTTP:
    alone: Stream
    busy: Stream
    long_running: bool  # the long answer was still streaming when the newcomer's first chunk came


def newcomer(target: Target, long_tokens: int) -> NewcomerOverHTTP:
    """NEWCOMER's first chunk alone, then while LONG_ANSWER streams (closed once it is measured)."""
    alone = stream_chat(target, NEWCOMER, 24)
    stop, long_first = threading.Event(), threading.Event()
    box: dict = {}
    thread = threading.Thread(
        target=lambda: box.update(
            long=stream_chat(target, LONG_ANSWER, long_tokens, stop=stop, on_first=long_first)
        )
    )
    thread.start()
    long_first.wait(300)
    time.sleep(1.0)  # well into the long answer
    if target.reset:
        target.reset()
    busy = stream_chat(target, NEWCOMER, 24)
    long_running = thread.is_alive()
    stop.set()
    thread.join(600)
    return NewcomerOverHTTP(alone=alone, busy=busy, long_running=long_running)


@dataclass
class Rows:
    """Everything measured on one target, for the side-by-side table."""

    target: Target
    single: Stream | None = None
    newcomer: NewcomerOverHTTP | None = None
    levels: dict | None = None  # users -> (streams, wall)
    peak_rss_mb: float | None = None
    ready_s: float | None = None

    def single_tps(self) -> float | None:
        s = self.single
        return s.tokens / s.total_s if s and s.ok and s.total_s else None

    def agg_tps(self, users: int) -> float | None:
        streams, wall = (self.levels or {}).get(users, ([], 0))
        if not streams or not wall or not all(s.ok for s in streams):
            return None
        return sum(s.tokens for s in streams) / wall

    def per_user_tps(self, users: int) -> float | None:
        streams, _ = (self.levels or {}).get(users, ([], 0))
        return median(s.tokens / s.total_s for s in streams if s.ok and s.total_s)

    def worst_first_ms(self, users: int) -> float | None:
        streams, _ = (self.levels or {}).get(users, ([], 0))
        firsts = [s.first_chunk_ms for s in streams if s.first_chunk_ms is not None]
        return max(firsts) if firsts and len(firsts) == len(streams) else None


def measure(
    target: Target,
    *,
    prompt: str,
    tokens: int,
    newcomer_tokens: int,
    levels: list[int],
    level_tokens: int,
    note=print,
) -> Rows:
    """The same rounds against any target: warm-up, one stream, the newcomer, N users."""
    rows = Rows(target=target)
    warm = stream_chat(target, "Hi", 4)
    if not warm.ok and target.usage and "stream_options" in (warm.error or ""):
        target.usage = False  # a server that refuses the field: count chunks instead
        warm = stream_chat(target, "Hi", 4)
    if not warm.ok:
        raise RuntimeError(f"{target.label}: warm-up failed: {warm.error}")
    note(f"  {target.label}: one stream of {tokens} tokens at most")
    rows.single = stream_chat(target, prompt, tokens)
    note(f"  {target.label}: a newcomer alone, then during a {newcomer_tokens}-token answer")
    rows.newcomer = newcomer(target, newcomer_tokens)
    rows.levels = {}
    for users in levels:
        note(f"  {target.label}: {users} concurrent user(s), {level_tokens} tokens each")
        prompts = [f"{prompt} (variant {users}-{k})" for k in range(users)]
        rows.levels[users] = together(target, prompts, level_tokens)
    return rows
