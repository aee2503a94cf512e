"""The official `openai` package (sync and async) against a live daphne and the real model."""

from __future__ import annotations

import json
import time

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.integration

SHORT = "Count from 1 to 10, separated by commas."
LONG = "Write a very long story about a dragon who learns to bake bread."
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
    "additionalProperties": False,
}

MAKE_KEYS = """
import json
from django.contrib.auth import get_user_model
from chat.stores.apikeys import apikey_create
keys = {}
for name in ("alice", "bob", "carol"):
    user, _ = get_user_model().objects.get_or_create(username=name)
    keys[name] = apikey_create(user=user, name="live test")[1]
print(json.dumps(keys))
"""


@pytest.fixture(scope="module")
def keys(daphne_server):
    """A key each for alice, bob and carol on the live server's database."""
    return json.loads(daphne_server.manage("shell", "-c", MAKE_KEYS).strip().splitlines()[-1])


def client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def stored(server, request_id: str, timeout: float = 60) -> dict:
    """The stored answer of a completion id, once it has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = server.query(
            "SELECT m.*, c.user_id, c.api_key_id FROM chat_message m "
            "JOIN chat_conversation c ON c.id = m.conversation_id WHERE m.request_id = ?",
            (request_id,),
        )
        if rows and rows[0]["status"] != "streaming":
            return rows[0] | {"metrics": json.loads(rows[0]["metrics"] or "null")}
        time.sleep(0.1)
    raise AssertionError(f"{request_id} not stored as ended")


def user_id(server, name: str) -> int:
    return server.query("SELECT id FROM auth_user WHERE username = ?", (name,))[0]["id"]


def test_models_lists_the_default_and_each_policy(daphne_server, keys):
    ids = [m.id for m in client(daphne_server, keys["alice"]).models.list()]
    assert ids[0] == "smollm2" and {"smollm2:chat", "smollm2:json"} <= set(ids)


def test_a_completion_has_content_usage_and_is_stored_with_its_metrics(daphne_server, keys):
    """stream false: the answer, max_tokens ending it with `length`, usage matching the stored metrics."""
    answer = client(daphne_server, keys["alice"]).chat.completions.create(
        model="smollm2",
        messages=[
            {"role": "system", "content": "You are a storyteller."},
            {"role": "user", "content": LONG},
        ],
        max_tokens=5,
    )
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 5
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 5
    row = stored(daphne_server, answer.id)
    assert row["text"] == choice.message.content and row["finish_reason"] == "length"
    assert row["metrics"]["new_tokens"] == 5 and row["api_key_id"] is not None
    assert row["user_id"] == user_id(daphne_server, "alice")


def test_a_stream_assembles_to_the_stored_answer_and_reports_usage(daphne_server, keys):
    """stream true with include_usage: deltas joined == stored text; a usage chunk at the end."""
    stream = client(daphne_server, keys["alice"]).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": SHORT}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    row = stored(daphne_server, chunks[0].id)
    assert (
        text == row["text"] and row["metrics"]["new_tokens"] == chunks[-1].usage.completion_tokens
    )


def test_a_stop_string_ends_the_answer_and_is_never_shown(daphne_server, keys):
    answer = client(daphne_server, keys["alice"]).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": SHORT}],
        stop=[","],
        max_tokens=30,
    )
    assert "," not in answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop"
    assert stored(daphne_server, answer.id)["finish_reason"] == "stop_string"


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_answer_validates_and_arrives_whole(daphne_server, keys, stream):
    """response_format json_schema (strict): the content is JSON valid for the schema; streamed,
    it arrives as one delta, after validation."""
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
    }
    answer = client(daphne_server, keys["bob"]).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        response_format=response_format,
        max_tokens=40,
        stream=stream,
    )
    if stream:
        chunks = list(answer)
        contents = [c.choices[0].delta.content for c in chunks if c.choices]
        contents = [c for c in contents if c]
        assert len(contents) == 1
        content = contents[0]
    else:
        content = answer.choices[0].message.content
    jsonschema.validate(json.loads(content), ANSWER_SCHEMA)


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}},
    ],
    ids=["json_object", "json_schema_not_strict"],
)
def test_json_object_and_a_non_strict_schema_give_valid_json(daphne_server, keys, response_format):
    """Without `strict` (instructor's JSON modes) the answer is still decoded under the schema:
    valid JSON, a JSON object for json_object, valid for the schema for json_schema."""
    answer = client(daphne_server, keys["carol"]).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        response_format=response_format,
        max_tokens=40,
    )
    value = json.loads(answer.choices[0].message.content)
    assert isinstance(value, dict)
    schema = response_format.get("json_schema", {}).get("schema")
    if schema:
        jsonschema.validate(value, schema)
    assert stored(daphne_server, answer.id)["retries"] == 0  # valid by construction


def test_closing_the_stream_cancels_the_model(daphne_server, keys):
    """The client reads a few deltas and closes the stream: the answer is stored as cancelled,
    long before its token limit."""
    stream = client(daphne_server, keys["carol"]).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": LONG}],
        max_tokens=300,
        stream=True,
    )
    seen = 0
    completion_id = None
    for chunk in stream:
        completion_id = chunk.id
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
            if seen == 3:
                break
    stream.close()
    row = stored(daphne_server, completion_id)
    assert row["status"] == "cancelled" and row["finish_reason"] == "cancelled"
    assert row["metrics"]["new_tokens"] < 100


@pytest.mark.parametrize("key", ["sk-wrong", "not-even-a-key"])
def test_a_wrong_key_gets_401(daphne_server, key):
    with pytest.raises(openai.AuthenticationError) as raised:
        client(daphne_server, key).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert raised.value.status_code == 401 and raised.value.code == "invalid_api_key"


def test_a_revoked_key_gets_401(daphne_server):
    out = daphne_server.manage("apikey", "create", "--user", "alice", "--name", "to revoke")
    key = out.strip().splitlines()[-1]
    assert client(daphne_server, key).models.list().data
    key_id = out.split("created key ")[1].split()[0]
    daphne_server.manage("apikey", "revoke", key_id)
    with pytest.raises(openai.AuthenticationError):
        client(daphne_server, key).models.list()


def test_bad_requests_get_openai_errors(daphne_server, keys):
    api = client(daphne_server, keys["alice"])
    with pytest.raises(openai.NotFoundError) as raised:
        api.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Hi"}], n=2
        )
    assert raised.value.param == "n"


async def test_the_async_client_streams_and_one_users_cancel_never_touches_anothers(
    daphne_server, keys
):
    """alice and bob stream at once through AsyncOpenAI; bob closes his stream: his answer is
    cancelled, alice's runs to its end, each stored as its own user's."""
    import asyncio

    def async_client(key):
        return openai.AsyncOpenAI(
            base_url=daphne_server.url + "/v1", api_key=key, max_retries=0, timeout=120
        )

    async def read(key: str, stop_after: int | None) -> str:
        stream = await async_client(key).chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": LONG}],
            max_tokens=24,
            stream=True,
        )
        seen = 0
        async for chunk in stream:
            completion_id = chunk.id
            if chunk.choices and chunk.choices[0].delta.content:
                seen += 1
                if stop_after is not None and seen == stop_after:
                    await stream.close()
                    break
        return completion_id

    alice_id, bob_id = await asyncio.gather(read(keys["alice"], None), read(keys["bob"], 2))
    alice, bob = stored(daphne_server, alice_id), stored(daphne_server, bob_id)
    assert bob["status"] == "cancelled"
    assert alice["status"] == "done" and alice["finish_reason"] in ("length", "eos")
    assert alice["user_id"] == user_id(daphne_server, "alice")
    assert bob["user_id"] == user_id(daphne_server, "bob")


def test_the_packages_structured_output_parse_gets_a_validated_object(daphne_server, keys):
    """`client.chat.completions.parse(response_format=<pydantic model>)`: the package's strict
    json_schema request, answered with JSON it parses into the model."""
    from pydantic import BaseModel

    class Capital(BaseModel):
        answer: str

    parsed = client(daphne_server, keys["carol"]).chat.completions.parse(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the capital of Italy?"}],
        response_format=Capital,
        max_tokens=40,
    )
    assert isinstance(parsed.choices[0].message.parsed, Capital)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
WEATHER_ASKED = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def _streamed_message(chunks) -> tuple[str, list[dict], str | None]:
    """(content, tool calls, finish_reason) assembled from streamed chunks as a client does:
    a call's index, id and name arrive first, its arguments after."""
    content, finish = "", None
    calls: dict[int, dict] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            if delta.id:
                assert call["id"] is None and not call["arguments"]  # id and name come first
                call["id"], call["name"] = delta.id, delta.function.name
            call["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_package_runs_a_whole_tool_loop(daphne_server, keys, stream):
    """A forced call with arguments valid for the tool's schema, the tool's result sent back
    with the call's id, then the model's answer (prose, or a further valid call)."""
    api = client(daphne_server, keys["alice"])
    asked = dict(model="smollm2", tools=[WEATHER_TOOL], max_tokens=60, stream=stream)
    first = api.chat.completions.create(messages=WEATHER_ASKED, tool_choice="required", **asked)
    if stream:
        _, calls, finish = _streamed_message(first)
    else:
        message = first.choices[0].message
        finish = first.choices[0].finish_reason
        assert message.content is None
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in message.tool_calls
        ]
    assert finish == "tool_calls" and calls
    for call in calls:
        assert call["id"].startswith("call_") and call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER_TOOL["function"]["parameters"])
    history = WEATHER_ASKED + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ],
        },
        *({"role": "tool", "tool_call_id": c["id"], "content": "sunny, 21 C"} for c in calls),
    ]
    final = api.chat.completions.create(messages=history, **asked)
    if stream:
        content, again, finish = _streamed_message(final)
    else:
        content = final.choices[0].message.content or ""
        again = [
            {"name": c.function.name, "arguments": c.function.arguments}
            for c in final.choices[0].message.tool_calls or ()
        ]
        finish = final.choices[0].finish_reason
    if again:
        assert finish == "tool_calls"
        for call in again:
            json.loads(call["arguments"])
    else:
        assert finish in ("stop", "length") and content.strip()


def test_a_stored_tool_call_keeps_its_calls(daphne_server, keys):
    """A tool call is stored as the assistant's answer, its calls as the answer's JSON value."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    answer = client(daphne_server, keys["bob"]).chat.completions.create(
        model="smollm2",
        messages=WEATHER_ASKED,
        tools=[WEATHER_TOOL],
        tool_choice=named,
        max_tokens=40,
    )
    row = stored(daphne_server, answer.id)
    (call,) = json.loads(row["json_value"])["tool_calls"]
    assert call["name"] == "get_weather" and row["retries"] == 0
    assert (
        json.loads(answer.choices[0].message.tool_calls[0].function.arguments) == call["arguments"]
    )
    assert row["metrics"]["new_tokens"] > 0


def test_bad_tools_are_400s_the_package_raises(daphne_server, keys):
    api = client(daphne_server, keys["carol"])
    bad = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/$defs/nowhere"}}}
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model="smollm2", messages=WEATHER_ASKED, tools=[bad])
    assert raised.value.body["param"] == "tools[0].function.parameters"
    stray = WEATHER_ASKED + [{"role": "tool", "tool_call_id": "call_nobody", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model="smollm2", messages=stray, tools=[WEATHER_TOOL])
    assert raised.value.body["param"] == "messages[1].tool_call_id"
