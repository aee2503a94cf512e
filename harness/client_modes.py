"""The structured-output client libraries, each in the modes its users pick, asking a /v1 for one object.

Every mode is the library's own documented call, unchanged: nothing here helps the model or
the server. A request counter on the HTTP client underneath tells how many requests one answer
took (the first ask plus the library's re-asks), the same way for every library.
`manage.py clientpassrate` measures them; tests/test_client_libraries.py drives them too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, Field

PROMPTS = Path(__file__).resolve().parent / "prompts" / "extraction.json"
SYSTEM = "Extract the person the user's text is about: their name, age in years and city."


class Person(BaseModel):
    """The object every mode asks for."""

    name: str = Field(min_length=1, max_length=40, description="the person's name")
    age: int = Field(ge=0, le=150, description="age in years")
    city: str = Field(min_length=1, max_length=40, description="the city they live in")


@dataclass
class Endpoint:
    """A server's /v1, the model to ask, and how much each ask may generate or re-ask."""

    base_url: str
    key: str
    model: str = "smollm2"
    max_tokens: int = 64
    reasks: int = 0  # re-asks the library may make after an answer that does not validate
    timeout: float = 300
    requests: int = field(default=0, init=False)  # chat completions sent since the last reset

    def _count(self, request) -> None:
        if request.method == "POST" and request.url.path.endswith("/chat/completions"):
            self.requests += 1

    async def _count_async(self, request) -> None:
        self._count(request)

    def http_client(self) -> httpx2.Client:
        return httpx2.Client(timeout=self.timeout, event_hooks={"request": [self._count]})

    def openai(self) -> OpenAI:
        """The official client, counting its requests; it never retries by itself."""
        return OpenAI(
            base_url=self.base_url,
            api_key=self.key,
            max_retries=0,
            timeout=self.timeout,
            http_client=self.http_client(),
        )

    def async_openai(self) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.key,
            max_retries=0,
            timeout=self.timeout,
            http_client=httpx2.AsyncClient(
                timeout=self.timeout, event_hooks={"request": [self._count_async]}
            ),
        )


def messages(text: str) -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


# -- the official openai SDK ---------------------------------------------------------------


def openai_parse(endpoint: Endpoint, text: str) -> Person:
    """`chat.completions.parse(response_format=Person)`: a strict json_schema response format."""
    answer = endpoint.openai().chat.completions.parse(
        model=endpoint.model,
        messages=messages(text),
        response_format=Person,
        max_tokens=endpoint.max_tokens,
        temperature=0,
    )
    parsed = answer.choices[0].message.parsed
    if parsed is None:
        raise ValueError(f"nothing parsed: {answer.choices[0].message.content!r}")
    return parsed


PERSON_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "record_person",
        "description": "Record the person the text is about.",
        "parameters": Person.model_json_schema(),
    },
}


def openai_forced_tool(endpoint: Endpoint, text: str) -> Person:
    """`tools` with `tool_choice` naming the function: the arguments are the object."""
    answer = endpoint.openai().chat.completions.create(
        model=endpoint.model,
        messages=messages(text),
        tools=[PERSON_TOOL],
        tool_choice={"type": "function", "function": {"name": "record_person"}},
        max_tokens=endpoint.max_tokens,
        temperature=0,
    )
    calls = answer.choices[0].message.tool_calls or []
    if len(calls) != 1 or calls[0].function.name != "record_person":
        raise ValueError(f"not one call of record_person: {answer.choices[0].message!r}")
    return Person.model_validate_json(calls[0].function.arguments)


# -- instructor ----------------------------------------------------------------------------


def instructor_mode(mode_name: str) -> Callable[[Endpoint, str], Person]:
    """instructor's `create(response_model=Person)` in one of its modes (TOOLS is its default)."""

    def ask(endpoint: Endpoint, text: str) -> Person:
        import instructor

        client = instructor.from_openai(endpoint.openai(), mode=instructor.Mode[mode_name])
        return client.chat.completions.create(
            model=endpoint.model,
            messages=messages(text),
            response_model=Person,
            max_retries=endpoint.reasks,
            max_tokens=endpoint.max_tokens,
            temperature=0,
        )

    ask.__doc__ = f"instructor, Mode.{mode_name}"
    return ask


# -- pydantic-ai ---------------------------------------------------------------------------


def pydantic_ai_agent(endpoint: Endpoint, output_type, **agent_options):
    """A pydantic-ai Agent on the OpenAI chat model pointed at the endpoint."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        endpoint.model, provider=OpenAIProvider(openai_client=endpoint.async_openai())
    )
    return Agent(
        model,
        output_type=output_type,
        instructions=SYSTEM,
        retries=endpoint.reasks,
        model_settings={"max_tokens": endpoint.max_tokens, "temperature": 0},
        **agent_options,
    )


def pydantic_ai_default(endpoint: Endpoint, text: str) -> Person:
    """pydantic-ai's default structured output: an output tool the model must call."""
    return pydantic_ai_agent(endpoint, Person).run_sync(text).output


def pydantic_ai_native(endpoint: Endpoint, text: str) -> Person:
    """pydantic-ai's `NativeOutput`: a json_schema response format."""
    from pydantic_ai import NativeOutput

    return pydantic_ai_agent(endpoint, NativeOutput(Person)).run_sync(text).output


# -- LangChain -----------------------------------------------------------------------------


def langchain_model(endpoint: Endpoint):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=endpoint.model,
        base_url=endpoint.base_url,
        api_key=endpoint.key,
        max_tokens=endpoint.max_tokens,
        temperature=0,
        max_retries=0,
        timeout=endpoint.timeout,
        http_client=endpoint.http_client(),
    )


def langchain_structured(method: str) -> Callable[[Endpoint, str], Person]:
    """LangChain's `with_structured_output(Person, method=...)`; it never re-asks."""

    def ask(endpoint: Endpoint, text: str) -> Person:
        runnable = langchain_model(endpoint).with_structured_output(Person, method=method)
        parsed = runnable.invoke(messages(text))
        if not isinstance(parsed, Person):
            raise ValueError(f"not a Person: {parsed!r}")
        return parsed

    ask.__doc__ = f"LangChain, with_structured_output(method={method!r})"
    return ask


# -- the table -----------------------------------------------------------------------------

# (label, ask, whether the server sees the schema): a mode that only describes the schema in the
# prompt (instructor's JSON) can get valid JSON from the server, never a binding schema.
MODES: list[tuple[str, Callable[[Endpoint, str], Person], bool]] = [
    ("openai parse (json_schema)", openai_parse, True),
    ("openai forced tool call", openai_forced_tool, True),
    ("instructor TOOLS (default)", instructor_mode("TOOLS"), True),
    ("instructor JSON_SCHEMA", instructor_mode("JSON_SCHEMA"), True),
    ("instructor JSON", instructor_mode("JSON"), False),
    ("pydantic-ai output tool (default)", pydantic_ai_default, True),
    ("pydantic-ai NativeOutput", pydantic_ai_native, True),
    ("LangChain json_schema", langchain_structured("json_schema"), True),
    ("LangChain function_calling", langchain_structured("function_calling"), True),
]


@dataclass
class Outcome:
    """One prompt through one mode: the object (None when the library gave up), requests, time."""

    parsed: Person | None
    requests: int
    seconds: float
    error: str | None = None

    @property
    def reasks(self) -> int:
        return max(self.requests - 1, 0)


def attempt(ask: Callable[[Endpoint, str], Person], endpoint: Endpoint, text: str) -> Outcome:
    """Ask once through a mode (with the library's own re-asks); never raises on a failed answer."""
    endpoint.requests = 0
    started = time.perf_counter()
    try:
        parsed = ask(endpoint, text)
        error = None
    except Exception as exc:  # a library's give-up comes in many types; the table counts them all
        parsed, error = None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}"
    return Outcome(parsed, endpoint.requests, time.perf_counter() - started, error)


def load_prompts(path: Path = PROMPTS) -> list[dict]:
    return json.loads(path.read_text())["prompts"]
