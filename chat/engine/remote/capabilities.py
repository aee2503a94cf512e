"""What an OpenAI-compatible inference server accepts, found out rather than assumed.

Servers differ on the edges of the API: vLLM takes `stop_token_ids` and `min_tokens`,
OpenAI refuses them; `transformers serve` answers `/v1/models` with a 500, refuses unknown
fields with a 422, and streams straight through `stop` and `response_format`. So:

- a field a 400/422 names is dropped from every later request, and the refused request
  is sent again once without it (`refused_in`);
- a stop string the server streams means it ignores `stop`: the holdback here cuts it and
  the stream is closed (the remote backend does both whatever the server does);
- a schema the server does not enforce is not relied on: the buffer gate holds and
  validates every structured answer here, re-asking as on the local path;
- a failing `/v1/models` beside a chat endpoint that answers is not an outage.

`discover` asks at start-up with a few requests of a few tokens; what later requests show
is learned too. Each finding is logged once.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Protocol

from ..types import EngineError, GenerationRequest, GenerationResult, Progress

log = logging.getLogger(__name__)

# Fields a request can do without: the answer is still an answer when the server refuses them.
OPTIONAL_FIELDS = (
    "stop",
    "stop_token_ids",
    "min_tokens",
    "response_format",
    "stream_options",
    "top_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "continue_final_message",
    "add_generation_prompt",
)
# A schema no model answers "Say hello." with unless the server enforces it.
PROBE_SCHEMA = {
    "type": "object",
    "properties": {"greeting": {"type": "string"}},
    "required": ["greeting"],
}


class Capabilities:
    """What one upstream was seen to accept; shared by every stream of one backend (thread-safe).

    Attributes:
        refused: optional request fields the server refused; never sent again.
        stop: "honoured", "ignored" (it streams stop strings through) or "unknown".
        schema: "enforced", "ignored", "refused" (response_format) or "unknown".
        models: "ok" or what `GET /models` answered instead; "unknown" before it was asked.
        chat: "ok" once a completion was answered; the failure while the last one failed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refused: set[str] = set()
        self.stop = "unknown"
        self.schema = "unknown"
        self.models = "unknown"
        self.chat = "unknown"
        self._told: set[str] = set()
        # Until discover() has logged its one line, findings go into that line, not their own.
        self.announced = False

    def body(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` without the fields this server refuses."""
        with self._lock:
            return {k: v for k, v in body.items() if k not in self.refused}

    def refused_in(self, status: int, message: str, body: dict[str, Any]) -> list[str]:
        """The optional fields of `body` a 400/422 `message` names, now recorded as refused."""
        if status not in (400, 422):
            return []
        named = [
            name
            for name in OPTIONAL_FIELDS
            if name in body and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", message)
        ]
        with self._lock:
            self.refused.update(named)
            if "response_format" in named:
                self.schema = "refused"
            if "stop" in named:
                self.stop = "refused"
        for name in named:
            self._tell(f"refused:{name}", f"refuses {name!r} (HTTP {status}); not sent again")
        return named

    def saw(self, **found: str) -> None:
        """Record findings, e.g. `saw(stop="ignored")`; a new one is logged once."""
        for name, value in found.items():
            with self._lock:
                changed = getattr(self, name) != value
                setattr(self, name, value)
            if changed and name != "chat":
                self._tell(f"{name}:{value}", f"{name}: {value}")

    def identity(self) -> dict[str, Any]:
        """What changes the answers the server gives us: the fields it refused (never sent
        again) and whether it enforces a schema."""
        with self._lock:
            return {"refused": sorted(self.refused), "schema": self.schema}

    @property
    def enforces_schema(self) -> bool:
        return self.schema == "enforced"

    def summary(self) -> str:
        with self._lock:
            refused = ", ".join(sorted(self.refused)) or "none"
            return (
                f"models endpoint {self.models}; stop {self.stop}; schema {self.schema}; "
                f"refused fields {refused}"
            )

    def _tell(self, key: str, line: str) -> None:
        with self._lock:
            if key in self._told or not self.announced:
                return
            self._told.add(key)
        log.info("upstream %s", line)

    def announce(self, progress: Progress, line: str) -> None:
        """Say `line` (what discovery found) once; later findings are logged one by one."""
        self.announced = True
        progress(line)


class _Address(Protocol):
    @property
    def base_url(self) -> str: ...


class Upstream(Protocol):
    """What discovery asks of the backend in front of the server (openai_backend.OpenAIBackend)."""

    @property
    def config(self) -> _Address: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def eos_token_ids(self) -> list[int]: ...

    def models_status(self, timeout: float = 1.0) -> str: ...

    def generate(self, request: GenerationRequest) -> GenerationResult: ...


def discover(backend: Upstream, progress: Progress = log.info) -> Capabilities:
    """Ask the server what it accepts: its model list, then three answers of a few tokens.

    Needs no tokenizer. A server that cannot be reached leaves everything "unknown"
    (requests then learn it); nothing here fails the start-up.
    """
    caps = backend.capabilities
    backend.models_status()
    hello = [{"role": "user", "content": "Say hello."}]

    def ask(**options: Any) -> GenerationResult:
        options.setdefault("max_new_tokens", 4)
        request = GenerationRequest.of([], messages=hello, temperature=0.0, **options)
        return backend.generate(request)

    try:
        # Every optional field at once, harmless values: a refusal names what to drop. A server
        # that names one field per refusal (OpenAI does) is asked again until none is left.
        eos = tuple(backend.eos_token_ids[:1])
        for _ in OPTIONAL_FIELDS:
            refused = len(caps.refused)
            try:
                plain = ask(eos_token_ids=eos, min_new_tokens=1)
                break
            except EngineError:
                if len(caps.refused) == refused:
                    raise
        else:
            raise EngineError("the server refused every optional field one by one")
        first = next((c for c in plain.text if not c.isspace()), None)
        if first is not None and caps.stop == "unknown":
            # The same greedy answer with its first letter as a stop string: a server that
            # honours `stop` never streams that letter.
            stopped = ask(stop_strings=(first,))
            if caps.stop == "unknown":  # the stream did not see the letter
                caps.saw(stop="honoured" if stopped.finish_reason != "length" else "unknown")
        if caps.schema == "unknown":
            shaped = ask(json_schema=PROBE_SCHEMA, max_new_tokens=2)
            if caps.schema == "unknown":
                caps.saw(schema="enforced" if shaped.text.lstrip().startswith("{") else "ignored")
    except EngineError as exc:
        caps.announce(progress, f"Upstream not asked at start-up ({exc}); requests will show it")
        return caps
    caps.announce(progress, f"Upstream {backend.config.base_url}: {caps.summary()}")
    return caps
