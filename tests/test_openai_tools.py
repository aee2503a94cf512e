"""Tools on /v1 with a scripted model: the reply's shape (whole and streamed), the history of a
tool loop as the model reads it, re-asks, storage, the cache key, and every bad input a 400 with
nothing stored. The real model and the `openai` package: tests/test_openai_api.py."""

from __future__ import annotations

import json

import pytest

from chat.models import Message, OutputPolicy
from chat.policy import ToolSpec
from chat.policy.tool_calls import call_text, judge_calls, parse_calls
from harness.scripted import Answer
from tests.test_openai_views import _user_with_key, ask, assert_openai_error, post

pytestmark = [pytest.mark.unit, pytest.mark.django_db(transaction=True)]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
PARIS = call_text("get_weather", {"city": "Paris"})


@pytest.fixture
def alice():
    return _user_with_key("alice")


def _spec(choice="auto", parallel=True) -> ToolSpec:
    functions = tuple(
        (t["function"]["name"], "", t["function"]["parameters"]) for t in (WEATHER, ADD)
    )
    return ToolSpec(functions=functions, choice=choice, parallel=parallel)


# -- the format, without a server --------------------------------------------------------


def test_calls_are_read_back_as_written_and_prose_is_kept_apart():
    prose, calls = parse_calls("Let me check.\n" + PARIS)
    assert prose == "Let me check." and calls == [
        {"name": "get_weather", "arguments": {"city": "Paris"}}
    ]


@pytest.mark.parametrize(
    ("text", "spec", "problem"),
    [
        ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', _spec(), "no tool"),
        (call_text("get_weather", {"city": 3}), _spec(), "get_weather"),
        ("It is sunny.", _spec("required"), "required"),
        (PARIS, _spec("add"), "no tool"),
        (PARIS + "\n" + PARIS, _spec(parallel=False), "parallel"),
        ("<tool_call>\n{not json\n</tool_call>", _spec(), "not a JSON object"),
    ],
)
def test_a_call_that_breaks_the_rules_is_invalid_and_says_why(text, spec, problem):
    judged = judge_calls(text, spec)
    assert not judged.calls and problem in judged.error


def test_prose_is_an_answer_under_auto_and_calls_are_checked_under_required():
    assert judge_calls("It is sunny.", _spec()).error == ""
    judged = judge_calls(PARIS + "\n" + call_text("add", {"a": 1, "b": 2}), _spec("required"))
    assert [c.name for c in judged.calls] == ["get_weather", "add"] and not judged.error


# -- the API ----------------------------------------------------------------------------


async def test_a_tool_call_is_message_tool_calls_and_is_stored_with_its_calls(scripted, alice):
    backend = scripted(Answer((PARIS[:20], PARIS[20:])))
    response, body = await post(alice[1], ask("Weather in Paris?", tools=[WEATHER, ADD]))
    assert response.status_code == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    request = backend.requests[0]
    grammar = request.params.tool_grammar
    assert grammar["tool_choice"] == "auto" and len(grammar["tools"]) == 2
    assert "<tools>" in request.messages[0]["content"]  # told in the system prompt
    shown = request.messages[-2]  # the worked example's call, right before the prompt
    assert shown["role"] == "assistant" and shown["content"].startswith("<tool_call>")
    stored = await Message.objects.aget(pk=body["message_id"])
    assert stored.json_value == {
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    }
    assert stored.text == PARIS and stored.metrics["new_tokens"] == 2


async def test_a_streamed_tool_call_sends_id_and_name_then_the_arguments(scripted, alice):
    scripted(Answer((PARIS,)))
    named = {"type": "function", "function": {"name": "get_weather"}}
    response, events = await post(
        alice[1], ask("Weather?", tools=[WEATHER], tool_choice=named, stream=True)
    )
    chunks = [e for e in events if e != "[DONE]" and e["choices"]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert calls[0]["index"] == 0 and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    assert "id" not in calls[1] and json.loads(calls[1]["function"]["arguments"]) == {
        "city": "Paris"
    }
    assert not any(d.get("content") for d in deltas)  # nothing of the raw call is shown
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_auto_may_answer_in_prose(scripted, alice):
    scripted(Answer(("Hello there.",)))
    _, body = await post(alice[1], ask("Hi", tools=[WEATHER]))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "Hello there."
    assert "tool_calls" not in choice["message"]


async def test_invalid_arguments_are_reasked_before_anything_is_sent(scripted, alice):
    await OutputPolicy.objects.acreate(name="c", slug="chat", is_default=True, max_retries=1)
    backend = scripted(Answer((call_text("get_weather", {"town": 1}),)), Answer((PARIS,)))
    _, body = await post(alice[1], ask("Weather?", tools=[WEATHER], tool_choice="required"))
    assert body["choices"][0]["finish_reason"] == "tool_calls" and len(backend.requests) == 2
    assert "tool_call" in backend.requests[1].messages[-1]["content"]
    assert (await Message.objects.aget(pk=body["message_id"])).retries == 1


async def test_a_tool_loop_history_is_read_by_the_model_as_calls_and_results(scripted, alice):
    backend = scripted(Answer(("It is sunny in Paris.",)))
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    _, body = await post(alice[1], {"model": "smollm2", "messages": messages, "tools": [WEATHER]})
    assert body["choices"][0]["message"]["content"] == "It is sunny in Paris."
    sent = backend.requests[0].messages
    assert sent[-2] == {"role": "assistant", "content": PARIS}
    assert sent[-1]["role"] == "user" and "<tool_response>\nsunny, 21 C" in sent[-1]["content"]
    stored = await Message.objects.filter(role=Message.Role.USER).alast()
    assert "sunny, 21 C" in stored.text  # the tool result is the turn's prompt


async def test_tools_and_tool_choice_are_part_of_the_cache_key(scripted, alice):
    await OutputPolicy.objects.acreate(name="c", slug="cached", cache_enabled=True)
    backend = scripted(Answer((PARIS,)), Answer((call_text("add", {"a": 1, "b": 2}),)))
    _, first = await post(alice[1], ask(model="smollm2:cached", tools=[WEATHER, ADD]))
    _, again = await post(alice[1], ask(model="smollm2:cached", tools=[WEATHER, ADD]))
    assert again["cached"] is True and len(backend.requests) == 1
    assert again["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    named = {"type": "function", "function": {"name": "add"}}
    _, other = await post(
        alice[1], ask(model="smollm2:cached", tools=[WEATHER, ADD], tool_choice=named)
    )
    assert other["cached"] is False and len(backend.requests) == 2


def _messages_with_a_stray_result():
    return [
        {"role": "user", "content": "Weather?"},
        {"role": "tool", "tool_call_id": "call_nobody_made", "content": "sunny"},
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"x": {"$ref": "#/$defs/missing"}},
                            },
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"$ref": "https://example.com/schema.json"},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tools": [WEATHER] * 65}, "tools"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "description": "x" * 17000},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "tools"),
        ({"messages": _messages_with_a_stray_result()}, "messages[1].tool_call_id"),
    ],
)
async def test_bad_tools_are_a_400_naming_the_field_and_store_nothing(
    scripted, alice, fields, param
):
    backend = scripted(Answer(("never",)))
    response, body = await post(alice[1], {**ask("Weather?"), **fields})
    error = assert_openai_error(response, body, 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert not backend.requests and not await Message.objects.aexists()


async def test_a_policy_with_its_own_schema_refuses_tools_and_stores_nothing(scripted, alice):
    await OutputPolicy.objects.acreate(
        name="j", slug="json", mode="buffer", json_schema={"type": "object"}
    )
    backend = scripted(Answer(("never",)))
    response, body = await post(alice[1], ask(model="smollm2:json", tools=[WEATHER]))
    error = assert_openai_error(response, body, 400)
    assert error["code"] == "bad_tools" and not backend.requests
    assert not await Message.objects.aexists()


async def test_tool_choice_none_tells_no_tools_and_constrains_nothing(scripted, alice):
    backend = scripted(Answer(("Hello.",)))
    _, body = await post(alice[1], ask(tools=[WEATHER], tool_choice="none"))
    assert body["choices"][0]["message"]["content"] == "Hello."
    assert backend.requests[0].params.tool_grammar is None
    assert "<tools>" not in json.dumps(backend.requests[0].messages)
