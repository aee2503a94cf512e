"""The structured-output client libraries nobody here wrote, pointed unchanged at a live daphne's /v1.

Each library is called as its own documentation shows, with a key made by `manage.py apikey
create`: the openai SDK (`parse`, a whole tool loop, streamed and not), instructor (TOOLS,
JSON_SCHEMA, JSON), pydantic-ai (its default output tool, NativeOutput, an agent with one tool)
and LangChain (`bind_tools`, `with_structured_output` by json_schema and by function_calling).
They assert structure (an object that validates, a call whose arguments follow its schema),
never the model's wording; every library's re-asks are off, so one bad answer fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jsonschema
import pytest
from pydantic import BaseModel, Field

from harness import client_modes as cm

pytestmark = pytest.mark.integration

TEXT = "Maria is 34 and lives in Lisbon."
WEATHER_QUESTION = "What is the weather like in Paris right now? Use the tool."
TOOL_RESULT = "14 degrees Celsius and light rain"


class Weather(BaseModel):
    """The one tool's parameters."""

    city: str = Field(min_length=1, max_length=40, description="the city to look up")


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": Weather.model_json_schema(),
    },
}


@pytest.fixture(scope="module")
def live_v1(daphne_server):
    """The session's daphne on the local engine (its prompt throttle off: these tests ask many
    times a minute), and an endpoint with a fresh API key of an account of their own."""
    daphne_server.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model as U; "
        "U().objects.get_or_create(username='clients')",
    )
    key = daphne_server.manage("apikey", "create", "--user", "clients").strip().splitlines()[-1]
    return cm.Endpoint(daphne_server.url + "/v1", key, max_tokens=64)


def valid_weather_arguments(arguments: str) -> dict:
    """Arguments a client got: a JSON string holding an object that follows the tool's schema."""
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, WEATHER_TOOL["function"]["parameters"])
    return parsed


# -- the openai SDK ------------------------------------------------------------------------


def test_openai_parse_returns_a_validated_object(live_v1):
    assert isinstance(cm.openai_parse(live_v1, TEXT), cm.Person)


def test_openai_forced_tool_call_carries_valid_arguments(live_v1):
    assert isinstance(cm.openai_forced_tool(live_v1, TEXT), cm.Person)


@dataclass
class StreamedCall:
    id: str | None = None
    name: str | None = None
    arguments: str = ""


def ask_for_tools(client, model: str, history: list, *, stream: bool, **options):
    """One request of the loop; (tool calls as (id, name, arguments), content, finish_reason),
    the streamed answer assembled as a client does: by index, id and name first, then deltas."""
    if not stream:
        answer = client.chat.completions.create(model=model, messages=history, **options)
        choice = answer.choices[0]
        calls = [
            (c.id, c.type, c.function.name, c.function.arguments)
            for c in choice.message.tool_calls or []
        ]
        return calls, choice.message.content, choice.finish_reason
    streamed: dict[int, StreamedCall] = {}
    content, finish = "", None
    for chunk in client.chat.completions.create(
        model=model, messages=history, stream=True, **options
    ):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = streamed.setdefault(delta.index, StreamedCall())
                if call.id is None:
                    # The first delta of a call names it; later ones only add arguments.
                    assert delta.id and delta.function.name, delta
                    call.id, call.name = delta.id, delta.function.name
                call.arguments += (delta.function and delta.function.arguments) or ""
            finish = choice.finish_reason or finish
    calls = [(c.id, "function", c.name, c.arguments) for _, c in sorted(streamed.items())]
    return calls, content or None, finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_openai_tool_loop_calls_gets_the_result_and_answers(live_v1, stream):
    """call (tool_choice required) -> the tool's result in the history -> a final answer."""
    client = live_v1.openai()
    history: list[dict] = [{"role": "user", "content": WEATHER_QUESTION}]
    options = {"tools": [WEATHER_TOOL], "max_tokens": live_v1.max_tokens, "temperature": 0}
    calls, _, finish = ask_for_tools(
        client, live_v1.model, history, stream=stream, tool_choice="required", **options
    )
    assert calls and finish == "tool_calls"
    for call_id, kind, name, arguments in calls:
        assert call_id.startswith("call_") and kind == "function" and name == "get_weather"
        valid_weather_arguments(arguments)
    history.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for i, _, n, a in calls
            ],
        }
    )
    history += [{"role": "tool", "tool_call_id": i, "content": TOOL_RESULT} for i, *_ in calls]
    calls, content, finish = ask_for_tools(
        client, live_v1.model, history, stream=stream, tool_choice="none", **options
    )
    assert not calls and content and finish in ("stop", "length")


# -- instructor ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes_that_send_the_schema_return_a_validated_object(live_v1, mode):
    assert isinstance(cm.instructor_mode(mode)(live_v1, TEXT), cm.Person)


def test_instructor_json_mode_always_gets_a_json_object(live_v1):
    """Mode.JSON describes the schema in the prompt and asks only for `json_object`: no server
    can bind the schema, but the answer is a JSON object, which instructor then validates."""
    import instructor
    from instructor.core.exceptions import InstructorRetryException

    client = instructor.from_openai(live_v1.openai(), mode=instructor.Mode.JSON)
    answers: list[str] = []
    client.on("completion:response", lambda r: answers.append(r.choices[0].message.content))
    try:
        parsed = client.chat.completions.create(
            model=live_v1.model,
            messages=cm.messages(TEXT),
            response_model=cm.Person,
            max_retries=0,
            max_tokens=live_v1.max_tokens,
            temperature=0,
        )
    except InstructorRetryException:
        parsed = None
    assert len(answers) == 1 and isinstance(json.loads(answers[0]), dict)
    assert parsed is None or isinstance(parsed, cm.Person)


# -- pydantic-ai ---------------------------------------------------------------------------


def test_pydantic_ai_default_output_tool_returns_a_validated_object(live_v1):
    assert isinstance(cm.pydantic_ai_default(live_v1, TEXT), cm.Person)


def test_pydantic_ai_native_output_returns_a_validated_object(live_v1):
    assert isinstance(cm.pydantic_ai_native(live_v1, TEXT), cm.Person)


def test_pydantic_ai_agent_runs_its_tool_then_answers(live_v1):
    """An agent with one tool: the first step must call it (tool_choice naming it), the tool runs
    with validated arguments, and the next step answers in prose with its result."""
    from pydantic_ai.capabilities import AbstractCapability

    class CallTheToolFirst(AbstractCapability):
        def get_model_settings(self):
            return lambda ctx: {"tool_choice": ["get_weather"] if ctx.run_step <= 1 else "none"}

    seen: list[str] = []
    agent = cm.pydantic_ai_agent(live_v1, str, capabilities=[CallTheToolFirst()])

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return TOOL_RESULT

    result = agent.run_sync(WEATHER_QUESTION)
    assert len(seen) >= 1 and all(seen)
    assert isinstance(result.output, str) and result.output


# -- LangChain -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output_returns_a_validated_object(live_v1, method):
    assert isinstance(cm.langchain_structured(method)(live_v1, TEXT), cm.Person)


@pytest.mark.parametrize("tool_choice", ["Weather", "any"])
def test_langchain_bind_tools_gets_a_call_with_valid_arguments(live_v1, tool_choice):
    """`bind_tools` with a pydantic class, forced by name or by "any" (OpenAI's `required`)."""
    model = cm.langchain_model(live_v1).bind_tools([Weather], tool_choice=tool_choice)
    reply = model.invoke(WEATHER_QUESTION)
    assert reply.tool_calls
    for call in reply.tool_calls:
        assert call["name"] == "Weather" and call["id"].startswith("call_")
        Weather.model_validate(call["args"])
